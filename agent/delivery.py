"""Delivery of step summaries to aggregator replicas: routed by job, acknowledged, resent, loss counted.

The forwarder never touches the sampling path: it polls the agent's summary ``RingBuffer`` from
its own threads (one router, one sender per replica), and the buffer itself is the resend store.

Routing. A summary goes to ``replicas[crc32(job) % N]`` (crc32 is stable across processes and
machines, unlike Python's salted ``hash``), so all ranks of a job, on every node, reach the same
replica, which can then join them by step. ``replicas`` is the configured list (``aggregators``:
``host:port,host:port``) or, for ``dns:///name:port`` (a Kubernetes headless service), the
sorted addresses of its A/AAAA records, re-resolved every ``delivery_resolve_s``. Each summary
is routed once, when the router first reads it, by the membership of that moment. A replica that
leaves the membership is drained (its sender keeps delivering what was routed to it) and then
closed; jobs move to their new owner from the change on (``% N`` moves most jobs when N changes).

Acknowledgements (``aggregator/ledger.py`` states the replica side). Per replica the sender keeps
``queued`` (routed, not sent) and ``inflight`` (sent, not acknowledged) sequence numbers. It sends
in increasing order on one stream, at most ``INFLIGHT_BATCHES`` batches ahead of the
acknowledgements. An ack ``a`` means the replica holds every number ``<= a`` routed to it. After a
cut, the inflight numbers go back to the front of the queue and the new stream starts with an
empty batch (a handshake) that the replica answers with its ack, then resends; numbers at or
below the ack are dropped by the replica as duplicates, so nothing is stored twice.

Loss, exact per replica. A routed number whose summary the buffer overwrote before the replica
acknowledged it is lost, counted in ``lost_total`` for that replica and sent in every batch, so
the agent's ``chopper_agent_delivery_lost_total{replica}`` equals the replica's ledger. One
subtlety keeps it exact: a number that was sent before a cut may have reached the replica even
though its ack did not come back. If the buffer overwrites such a number, it is held as
*unresolved* until the first ack of the next stream decides it (``<= ack``: delivered; else lost).
The router itself reads the buffer at least every ``delivery_interval_s``; if it ever fell a whole
buffer behind (100,000 summaries), the missed summaries were never routed and are counted under
``replica=""``.

Streams on demand. A sender opens its replica's stream only when it has something for it:
numbers routed there and not yet acknowledged, a loss count the replica has not been told (one
sent on a stream cut before every batch was answered counts as not told), or positions of ranks
whose jobs the replica owns. A stream with none of these for ``IDLE_CLOSE_S``, every batch
answered, is closed, its replica holding every number and the loss count sent on it. So a node
holds streams only to the replicas that own its jobs, not to every replica (a stream holds one of
a replica's worker slots, ``aggregator.server.MAX_WORKERS``), and
``chopper_agent_delivery_connected`` is 0 for a replica with nothing of this node's to take.

Positions. With ``positions`` (the agent's ``rank_positions``), each stream also sends where the
agent's ranks are (``SummaryBatch.positions``, docs/HANGS.md) about every ``POSITIONS_INTERVAL_S``
(or ``delivery_interval_s`` if longer): those of the jobs the replica owns. A batch of summaries
carries them once the last ones sent are half that interval old; a batch of their own goes when
they are ``POSITIONS_OWN_BATCH`` intervals old (a hung job makes no summaries). So a job that
steps about once a second sends one batch a second, not a batch of summaries and one of
positions, and the positions a replica holds are 0.5 to 1.5 intervals old. They are not sequenced:
the replica keeps the newest, and one lost in a cut is replaced within 1.5 intervals.

Transport. Plaintext by default; with ``aggregator_tls_ca`` (and ``aggregator_tls_cert``/``key``
for mutual TLS) every stream is TLS, the replica's certificate checked against the configured
name: ``host`` of ``host:port``, or the service name of ``dns:///name:port`` (the resolved pod
IPs are only where to connect). Certificate files are read at each reconnect, so renewed ones
are picked up without a restart.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from agent.buffers import RingBuffer
from chopper.daemon.settings import is_loopback
from chopper.daemon.tls import ClientTLS
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.proto.chopper.v1 import aggregator_pb2_grpc as apb_grpc

log = logging.getLogger(__name__)

DNS_PREFIX = "dns:///"
# Batches sent ahead of acknowledgements: enough to hide a round trip, few enough that a cut
# leaves little in doubt.
INFLIGHT_BATCHES = 4
# Router reads per pass, and the widest span of sequence numbers one batch read covers.
READ_CHUNK = 8192
# Reconnect backoff, doubling from the first to the second figure, seconds.
BACKOFF_S = (0.2, 5.0)
# How often each stream sends its replica where the ranks are, s (at least delivery_interval_s).
POSITIONS_INTERVAL_S = 1.0
# Positions this many intervals old go in a batch of their own (module docstring); a batch of summaries
# carries them from half an interval.
POSITIONS_OWN_BATCH = 1.5
# A stream with nothing to send or to be acknowledged for this long is closed (module docstring), s.
IDLE_CLOSE_S = 30.0
UNROUTED = ""


def delivery_tls(settings: Any) -> ClientTLS | None:
    """The TLS of an agent's ``aggregator_tls_*`` settings; None (plaintext) when none is set."""
    if not (settings.aggregator_tls_ca or settings.aggregator_tls_cert):
        return None
    return ClientTLS(settings.aggregator_tls_ca, settings.aggregator_tls_cert, settings.aggregator_tls_key,
                     names=("aggregator_tls_ca", "aggregator_tls_cert", "aggregator_tls_key"))


def stable_hash(job: str) -> int:
    """A hash of the job name that every process on every node agrees on (crc32 of UTF-8)."""
    return zlib.crc32(job.encode())


def route(job: str, replicas: tuple[str, ...]) -> str:
    """The replica that owns ``job``: ``replicas[stable_hash(job) % len(replicas)]``."""
    return replicas[stable_hash(job) % len(replicas)]


def parse_targets(spec: str) -> list[str]:
    """Split the ``aggregators`` setting into entries: ``host:port`` items or one ``dns:///name:port``.

    Raises:
        ValueError: An entry is not ``host:port`` or a DNS name is mixed with other entries.
    """
    entries = [e.strip() for e in spec.split(",") if e.strip()]
    for e in entries:
        body = e.removeprefix(DNS_PREFIX)
        host, sep, port = body.rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"{e!r} is not host:port or dns:///name:port")
    if any(e.startswith(DNS_PREFIX) for e in entries) and len(entries) > 1:
        raise ValueError("a dns:/// entry names the whole replica set; give it alone")
    return entries


def resolve(entries: list[str], getaddrinfo: Callable[..., list] = socket.getaddrinfo) -> tuple[str, ...]:
    """The sorted, de-duplicated replica addresses (``host:port``) that ``entries`` name now.

    A ``dns:///name:port`` entry becomes one address per A/AAAA record, so every agent that
    resolves the same service gets the same list in the same order (routing depends on it).
    """
    out: set[str] = set()
    for e in entries:
        if not e.startswith(DNS_PREFIX):
            out.add(e)
            continue
        host, _, port = e.removeprefix(DNS_PREFIX).rpartition(":")
        for _family, _type, _proto, _name, sockaddr in getaddrinfo(host, int(port), type=socket.SOCK_STREAM):
            ip = str(sockaddr[0])
            out.add(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}")
    return tuple(sorted(out))


@dataclass
class ReplicaState:
    """One replica's side table and counters; guarded by ``Forwarder._lock``."""

    address: str
    queued: deque[int] = field(default_factory=deque)
    inflight: deque[int] = field(default_factory=deque)
    # Sent before the last cut and not acknowledged: may or may not be on the replica.
    doubtful: set[int] = field(default_factory=set)
    # Doubtful numbers the buffer overwrote, decided by the next ack.
    unresolved: list[int] = field(default_factory=list)
    sent_total: int = 0
    acked_total: int = 0
    lost_total: int = 0
    lost_reported: int = 0  # the loss count the latest batch sent carried; -1: unknown to the replica
    unacked_batches: int = 0  # batches of the current stream not yet answered (every batch gets an ack)
    connected: bool = False
    retiring: bool = False
    stream_id: int = 0
    acked_this_stream: bool = False
    idle_closed: bool = False  # the latest stream ended for want of anything to send

    @property
    def owed(self) -> bool:
        """Whether this replica is owed numbers, a loss count or the answer to a batch (caller holds the lock)."""
        return self.pending > 0 or self.lost_total != self.lost_reported or self.unacked_batches > 0

    @property
    def pending(self) -> int:
        """Routed and not yet acknowledged (nor lost)."""
        return len(self.queued) + len(self.inflight) + len(self.unresolved)


class Forwarder:
    """Delivers a summary ring buffer to aggregator replicas.

    Args:
        buffer: The agent's step-summary buffer (the resend store).
        agent: Stable agent name (the node).
        targets: The ``aggregators`` setting: ``host:port,...`` or ``dns:///name:port``.
        batch: Most summaries per ``SummaryBatch``.
        interval_s: How often the router polls the buffer (the batching delay), seconds.
        resolve_s: How often a ``dns:///`` target is re-resolved, seconds.
        incarnation: Id of this agent process (random by default).
        getaddrinfo: Name resolution (injected in tests).
        tls: TLS (and client certificate) for the replicas; None: plaintext.
        positions: Where the agent's ranks are now (``Agent.rank_positions``), read from the
            sender threads; None: no positions are sent.
        idle_close_s: A stream with nothing to send or to be acknowledged for this long is
            closed, seconds (``IDLE_CLOSE_S``).
    """

    def __init__(
        self,
        buffer: RingBuffer[pb.StepSummary],
        agent: str,
        targets: str,
        batch: int = 512,
        interval_s: float = 0.1,
        resolve_s: float = 30.0,
        incarnation: str | None = None,
        getaddrinfo: Callable[..., list] = socket.getaddrinfo,
        tls: ClientTLS | None = None,
        positions: Callable[[], list[pb.RankPosition]] | None = None,
        idle_close_s: float = IDLE_CLOSE_S,
    ) -> None:
        self.buffer = buffer
        self.idle_close_s = idle_close_s
        self._positions = positions
        self.positions_interval_s = max(interval_s, POSITIONS_INTERVAL_S)
        self.agent = agent
        self.incarnation = incarnation or uuid.uuid4().hex
        self.entries = parse_targets(targets)
        self.batch = batch
        self.interval_s = interval_s
        self.resolve_s = resolve_s
        self._getaddrinfo = getaddrinfo
        self.tls = tls
        # A dns:/// name resolves to pod IPs; their certificates carry the service name instead.
        dns = [e for e in self.entries if e.startswith(DNS_PREFIX)]
        self._tls_name = dns[0].removeprefix(DNS_PREFIX).rpartition(":")[0] if dns else ""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._stop = threading.Event()
        self.replicas: dict[str, ReplicaState] = {}
        self.membership: tuple[str, ...] = ()
        self.unrouted_lost_total = 0
        self._cursor = buffer.next_seq
        self._threads: list[threading.Thread] = []
        self._calls: dict[str, grpc.Future] = {}
        self._next_resolve = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start routing from the summaries buffered from now on."""
        remote = [e for e in self.entries if not is_loopback(e.removeprefix(DNS_PREFIX).rpartition(":")[0])]
        if self.tls is None and remote:
            # Summaries name jobs, ranks and hosts, and anyone on the path can forge or read them.
            log.warning("event=plaintext_delivery aggregators=%s note=step summaries go to another machine in "
                        "clear; set aggregator_tls_ca (and aggregator_tls_cert/key for mutual TLS, docs/SECURITY.md)",
                        ",".join(remote))
        self._cursor = self.buffer.next_seq
        router = threading.Thread(target=self._route_loop, name="delivery-router", daemon=True)
        self._threads.append(router)
        router.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop all threads (what is unacknowledged stays unacknowledged)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
            calls = list(self._calls.values())
        for call in calls:
            call.cancel()
        for t in list(self._threads):
            t.join(timeout_s)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per replica: sent, acked, lost, pending and connected, consistently, for the metrics."""
        with self._lock:
            out = {
                r.address: {
                    "sent": r.sent_total, "acked": r.acked_total, "lost": r.lost_total,
                    "pending": r.pending, "connected": 1.0 if r.connected else 0.0,
                }
                for r in self.replicas.values()
            }
            if self.unrouted_lost_total:
                out[UNROUTED] = {"sent": 0, "acked": 0, "lost": self.unrouted_lost_total, "pending": 0,
                                 "connected": 0.0}
            return out

    # -- routing -----------------------------------------------------------------------------

    def _route_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._refresh_membership()
                self.route_once()
            except Exception as exc:  # delivery is best effort; never let one bad pass end it
                log.warning("event=delivery_route_failed error=%r", str(exc))
            self._stop.wait(self.interval_s)

    def _refresh_membership(self) -> None:
        now = time.monotonic()
        if now < self._next_resolve:
            return
        # A static list never changes; a DNS name is looked up again later.
        dynamic = any(e.startswith(DNS_PREFIX) for e in self.entries)
        self._next_resolve = now + self.resolve_s if dynamic else float("inf")
        try:
            members = resolve(self.entries, self._getaddrinfo)
        except OSError as exc:  # keep the last good membership while DNS is unhappy
            log.warning("event=delivery_resolve_failed targets=%s error=%r", ",".join(self.entries), str(exc))
            return
        if members:
            self.set_membership(members)

    def set_membership(self, members: tuple[str, ...]) -> None:
        """Route summaries read from now on to ``members``; replicas that left are drained."""
        with self._cond:
            if members == self.membership:
                return
            log.info("event=delivery_membership replicas=%s", ",".join(members))
            self.membership = members
            for address in members:
                state = self.replicas.get(address)
                if state is None:
                    self.replicas[address] = ReplicaState(address)
                    t = threading.Thread(target=self._send_loop, args=(address,), name=f"delivery-{address}",
                                         daemon=True)
                    self._threads.append(t)
                    t.start()
                else:
                    state.retiring = False
            for address, state in self.replicas.items():
                if address not in members:
                    state.retiring = True
            self._cond.notify_all()

    def route_once(self) -> None:
        """Read every summary buffered since the last pass and queue its number for its replica."""
        while True:
            items, cursor, missed = self.buffer.read(self._cursor, READ_CHUNK)
            start = cursor - len(items)
            with self._cond:
                self.unrouted_lost_total += missed
                members = self.membership
                if members:
                    for i, s in enumerate(items):
                        self.replicas[route(s.job, members)].queued.append(start + i)
                    self._cursor = cursor
                self._prune()
                self._cond.notify_all()
            if len(items) < READ_CHUNK or not members:
                return

    def _prune(self) -> None:
        """Count queued numbers the buffer overwrote (caller holds the lock); bounds ``queued``."""
        first = self.buffer.read(0, 0)[1]
        for r in self.replicas.values():
            self._drop_overwritten(r, first)

    def _drop_overwritten(self, r: ReplicaState, first: int) -> None:
        while r.queued and r.queued[0] < first:
            seq = r.queued.popleft()
            if seq in r.doubtful:
                r.doubtful.discard(seq)
                r.unresolved.append(seq)
            else:
                r.lost_total += 1

    # -- sending -----------------------------------------------------------------------------

    def _send_loop(self, address: str) -> None:
        backoff = BACKOFF_S[0]
        while not self._stop.is_set():
            with self._lock:
                r = self.replicas[address]
                if r.retiring and r.pending == 0:
                    del self.replicas[address]
                    log.info("event=delivery_replica_drained replica=%s", address)
                    return
            if not self._await_work(r):
                continue  # stopped, or retiring with nothing left: decided at the top
            started = time.monotonic()
            r.idle_closed = False
            try:
                self._stream(address)
            except Exception as exc:  # a bug or odd reply must not end delivery to this replica for good
                log.warning("event=delivery_stream_failed replica=%s error=%r", address, str(exc))
            if self._stop.is_set():
                return
            if r.idle_closed:  # closed on purpose, not cut: no backoff
                backoff = BACKOFF_S[0]
                continue
            # A stream that lived a while was healthy: start the backoff over.
            if time.monotonic() - started > 10 * BACKOFF_S[1]:
                backoff = BACKOFF_S[0]
            self._stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_S[1])

    def _await_work(self, r: ReplicaState) -> bool:
        """Wait until ``r`` is owed something or positions of its jobs are due; False when the wait
        should end without a stream (the forwarder stops, or ``r`` retires with nothing owed)."""
        while True:
            with self._cond:
                if self._stop.is_set() or (r.retiring and r.pending == 0):
                    return False
                if r.owed:
                    return True
            if self._positions_for(r.address):  # read outside the lock: it takes the agent's marker lock
                return True
            with self._cond:
                if not (self._stop.is_set() or r.owed or r.retiring):
                    self._cond.wait(self.positions_interval_s)

    def _stream(self, address: str) -> None:
        """One ``Deliver`` stream to ``address`` until it fails or the forwarder stops."""
        with self._lock:
            r = self.replicas[address]
            r.stream_id += 1
            stream_id = r.stream_id
            r.acked_this_stream = False
            # Everything unacknowledged goes again, in order, before anything new.
            r.doubtful.update(r.inflight)
            r.queued.extendleft(reversed(r.inflight))
            r.inflight.clear()
        channel = self._channel(address)
        call = None
        try:
            stub = apb_grpc.AggregatorStub(channel)
            call = stub.Deliver(self._requests(address, stream_id))
            with self._lock:
                self._calls[address] = call
            if self._stop.is_set():
                return
            for ack in call:
                self._on_ack(address, ack)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            log.info("event=delivery_stream_ended replica=%s code=%s", address, code)
        finally:
            with self._cond:
                r.connected = False
                r.stream_id += 1  # ends the request generator of this stream
                if r.unacked_batches:  # a loss count sent may not have arrived: the next stream says it again
                    r.lost_reported = -1
                r.unacked_batches = 0
                self._cond.notify_all()
            if call is not None:
                call.cancel()
                with self._lock:
                    if self._calls.get(address) is call:
                        del self._calls[address]
            channel.close()

    def _channel(self, address: str) -> grpc.Channel:
        """Plaintext, or TLS checked against the name the replica was configured by (not its IP)."""
        if self.tls is None:
            return grpc.insecure_channel(address)
        options = [("grpc.ssl_target_name_override", self._tls_name)] if self._tls_name else []
        return grpc.secure_channel(address, self.tls.credentials(), options=options)

    def _requests(self, address: str, stream_id: int) -> Iterator[apb.SummaryBatch]:
        """The batches of one stream: a handshake, then summaries as they are routed here.

        A batch without summaries also goes out when the loss count changed and nothing else
        would carry it soon, so the replica's ledger agrees with the agent without new traffic,
        and when positions are due (module docstring) and no summary would carry them.
        """
        with self._lock:
            r = self.replicas[address]
            r.lost_reported = r.lost_total
            r.unacked_batches += 1
        yield apb.SummaryBatch(agent=self.agent, incarnation=self.incarnation, lost_total=r.lost_reported)
        window = INFLIGHT_BATCHES * self.batch
        positions_due_at = 0.0 if self._positions is not None else float("inf")  # in a batch of their own
        positions_at = -float("inf")  # when positions last went on this stream
        busy_at = time.monotonic()  # when the stream last had something to send or to be acknowledged
        closing = False  # idle for idle_close_s: closed unless the positions read now has some
        while True:
            with self._cond:
                while True:
                    if self._stop.is_set() or r.stream_id != stream_id or (r.retiring and r.pending == 0):
                        return
                    sendable = bool(r.queued) and len(r.inflight) < window
                    now = time.monotonic()
                    if r.owed:
                        busy_at, closing = now, False
                    elif now - busy_at >= self.idle_close_s:
                        if closing:
                            r.idle_closed = True
                            return
                        closing, positions_due_at = True, now
                    wait_s = positions_due_at - now
                    if sendable or r.lost_total != r.lost_reported or wait_s <= 0:
                        break
                    self._cond.wait(min(1.0, wait_s))
                batch = self._take(r) if sendable else None
                lost_changed = r.lost_total != r.lost_reported
                if batch is None:
                    batch = apb.SummaryBatch(agent=self.agent, incarnation=self.incarnation, lost_total=r.lost_total)
            now = time.monotonic()
            carried = bool(batch.seq) and now - positions_at >= self.positions_interval_s / 2
            if now >= positions_due_at or (carried and self._positions is not None):
                positions_at = now
                positions_due_at = now + POSITIONS_OWN_BATCH * self.positions_interval_s
                # Read outside the lock: it takes the agent's marker lock.
                batch.positions.extend(self._positions_for(address))
            if batch.seq or batch.positions or lost_changed:
                if batch.positions:
                    busy_at, closing = time.monotonic(), False
                with self._lock:
                    r.lost_reported = batch.lost_total
                    r.unacked_batches += 1
                yield batch

    def _positions_for(self, address: str) -> list[pb.RankPosition]:
        """Where the ranks of the jobs that ``address`` owns are now; [] when reading them fails (logged)."""
        members = self.membership
        if self._positions is None or address not in members:
            return []
        try:
            positions = self._positions()
        except Exception as exc:  # where the ranks are is a side dish; never let it end the stream
            log.warning("event=delivery_positions_failed error=%r", str(exc))
            return []
        return [p for p in positions if route(p.job, members) == address]

    def _take(self, r: ReplicaState) -> apb.SummaryBatch | None:
        """Move up to ``batch`` queued numbers to inflight and build their batch (caller holds the lock)."""
        first_seq = r.queued[0]
        span = min(READ_CHUNK, r.queued[min(self.batch, len(r.queued)) - 1] - first_seq + 1)
        items, cursor, _ = self.buffer.read(first_seq, span)
        start = cursor - len(items)
        self._drop_overwritten(r, start)
        seqs: list[int] = []
        summaries: list[pb.StepSummary] = []
        while r.queued and len(seqs) < self.batch and r.queued[0] < cursor:
            seq = r.queued.popleft()
            seqs.append(seq)
            summaries.append(items[seq - start])
            r.inflight.append(seq)
        if not seqs:
            return None
        r.sent_total += len(seqs)
        return apb.SummaryBatch(agent=self.agent, incarnation=self.incarnation, seq=seqs, summaries=summaries,
                                lost_total=r.lost_total)

    def _on_ack(self, address: str, ack: apb.DeliveryAck) -> None:
        if ack.incarnation and ack.incarnation != self.incarnation:
            return
        acked = ack.acked_seq
        with self._cond:
            r = self.replicas[address]
            r.unacked_batches = max(0, r.unacked_batches - 1)
            if not r.connected:
                r.connected = True
                log.info("event=delivery_connected replica=%s acked_seq=%d", address, acked)
            for dq in (r.inflight, r.queued):
                while dq and dq[0] <= acked:
                    r.doubtful.discard(dq.popleft())
                    r.acked_total += 1
            if not r.acked_this_stream:
                # The first ack after a cut decides what the cut left in doubt.
                r.acked_this_stream = True
                for seq in r.unresolved:
                    if seq <= acked:
                        r.acked_total += 1
                    else:
                        r.lost_total += 1
                r.unresolved.clear()
                r.doubtful.clear()
            self._cond.notify_all()
