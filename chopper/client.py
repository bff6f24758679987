"""The job-side marker client: step/phase/collective markers streamed to the node agent.

Two halves that share only a bounded queue:

* **Hot path** (training thread). Entering or leaving ``step``/``phase``/``collective`` reads the
  clock (``time.time_ns()``, or records a device event, see ``chopper._device_clock``) and appends
  one small tuple to a ``collections.deque``. If the queue already holds ``queue_size`` markers
  the marker is dropped and counted. Nothing allocates a proto, takes a lock, blocks or raises:
  any internal error is counted as a drop. Cost: a few hundred ns per marker
  (``benchmarks/bench_marker_cost.py``).
* **Sender** (one daemon thread, started with the client; grpc and the stubs are imported there,
  so ``import chopper`` stays light). Algorithm:

  1. For a ``unix:`` target, connect to the agent's marker socket beside it
     (``chopper.schema.marker_socket_path``, ``agent.marker_socket``): a ``SOCK_SEQPACKET``
     socket that takes each batch as one datagram, far cheaper for both sides than a gRPC message.
     Where there is none (a TCP target, an agent without one, or one restarting), open one gRPC
     channel to the target and wait until it is READY, ``backoff`` seconds at most. Not ready:
     warn once per disconnect, double ``backoff`` (capped, 50 ms → 2 s by default) and retry.
     Markers wait in the queue meanwhile; overflow drops.
  2. Stream batches made by ONE generator: on the marker socket the sender thread sends each batch
     it yields as a datagram; on gRPC it is the request iterator of ONE client-streaming
     ``PushMarkers`` call, run by gRPC's request-consumer thread. Each turn it packs the queue head
     into a ``MarkerBatch`` of at most ``max_batch`` markers when the queue holds a full batch or
     ``flush_interval_s`` has passed (device timestamps are resolved here, in order; packing stops
     at the first event the GPU has not reached); with nothing queued it sleeps until the first
     marker. A batch goes in column form (``MarkerColumns``: one call per column, no message per
     marker) when every name in it was checked before and protobuf takes every value; otherwise each
     marker is written into the batch as a ``Marker`` and checked alone. ``seq`` increases from 1
     over the client's life, across streams.
     Packing checks each marker against what the wire and the agent take (``chopper.identity.jobname``),
     so that one bad marker never costs its batch: a phase or collective name over 256
     characters, or a step that is not an integer, drops that marker (counted, with its reason);
     an unprintable name is escaped and sent; a ``flops``/``tokens``/``bytes`` value that is not
     a number is left out and the marker sent without it (counted). Values the wire holds but
     the agent refuses (NaN or negative FLOPs) go as they are: the agent drops that field, keeps
     the step and flags it. A batch stops at ``_BATCH_BYTES`` of markers, so no agent setting
     refuses a whole batch for its size.
  3. The generator is resumed only after a batch's write completed (gRPC's write, or the kernel
     taking the datagram), so that resumption counts the batch as **sent** (handed to the
     transport). When the stream breaks (agent stopped or restarted), the batch yielded but not
     yet confirmed is **dropped and counted**: whether it reached the agent cannot be known. Its
     ``seq`` stays used, so the agent sees the gap. Batches already confirmed are counted as sent
     even if a dying agent never read them. A full socket queue (a slow agent) blocks the sender
     thread, never the training thread: markers then wait in the bounded queue.
  4. Go back to 1. A stream that confirmed a batch resets ``backoff``. Anything else that fails
     in the sender (a target gRPC cannot parse, an error of ours) is logged once and retried
     after ``backoff``: the thread never dies, and what it held is counted.
  5. ``shutdown(timeout)`` stops accepting markers, lets the generator flush the queue and close
     the stream (on the marker socket: shut the write side and read the agent's answer, the
     ``PushMarkersResponse``), and waits ``timeout`` at most; then it cancels the call (shuts the
     socket down) and closes the channel.
     Markers still queued when the sender exits are counted as dropped.

``chopper capture`` is served by ``chopper.profiler.CaptureControl`` (its own control thread);
a step calls into it only while a capture is pending or running.

``client_dropped_total`` in every batch carries the cumulative drop count (queue full, internal
error, invalid, in flight at a break, abandoned at shutdown), so the agent can report loss per rank.

Identity is checked once, when the client is made: text that no protobuf string holds (a
``CHOPPER_JOB`` that is not UTF-8 reads as surrogate escapes) or that the agent refuses is
replaced by the nearest text it accepts (``chopper.identity.jobname.usable_job_name``), and a rank or GPU
outside int32 by 0 or -1, each with a warning naming the value used and the fix; non-UTF-8 bytes
of a unix socket path are percent-encoded, which gRPC decodes back. So every batch encodes.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import os
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from chopper import local_socket
from chopper._device_clock import DeviceClock
from chopper._noop import NOOP, _NoOp  # noqa: F401 - re-exported, chopper.client.NOOP as before
from chopper.identity.device import UNRESOLVED, canonical_uuid, match_uuid
from chopper.identity.jobname import (
    MAX_MARKER_NAME_CHARS,
    escape_unprintable,
    job_name_problem,
    marker_name_problem,
    usable_job_name,
)
from chopper.identity.launcher import MAX_INDEX
from chopper.profiler import CaptureControl
from chopper.schema import (
    MAX_MARKERS_PER_BATCH,
    PID_METADATA,
    UNREAD_METADATA,
    ClockSource,
    MarkerKind,
    control_socket_path,
    marker_count,
    marker_socket_path,
)

if TYPE_CHECKING:
    from chopper.proto.chopper.v1 import agent_pb2

logger = logging.getLogger("chopper.client")

# Plain ints: IntEnum attribute access and hashing cost more on the hot path.
_STEP_BEGIN = int(MarkerKind.STEP_BEGIN)
_STEP_END = int(MarkerKind.STEP_END)
_PHASE_BEGIN = int(MarkerKind.PHASE_BEGIN)
_PHASE_END = int(MarkerKind.PHASE_END)
_COLL_BEGIN = int(MarkerKind.COLLECTIVE_BEGIN)
_COLL_END = int(MarkerKind.COLLECTIVE_END)
_CPU = int(ClockSource.CPU)
_DEVICE = int(ClockSource.DEVICE)

# A queued marker: (kind, ts_ns or device event, step, name, flops, tokens, bytes); 0 where not given.
Item = tuple[int, Any, int, str, Any, Any, Any]

_T = TypeVar("_T")
_INT64_MAX = 2**63 - 1
# Encoded bytes of a marker besides its name (seven scalar fields with their tags), rounded up;
# a name counts 4 bytes a character, the most UTF-8 takes.
_MARKER_BYTES = 64
# The most one marker adds to the columns of a MarkerColumns: varints of ts_ns, step, tokens and
# bytes (10 bytes each at most), a double of flops, a kind and a name index (1 and 2: at most
# MAX_NAMES_REMEMBERED names); its name, once per batch, counts as above.
_COLUMN_MARKER_BYTES = 52
# Most marker bytes in one batch: under the smallest message an agent accepts (twice its
# max_message_bytes, which is at least 64 KiB: agent/config.py, chopper/daemon/serving.py), less the
# batch's header (a job name and a device UUID, at most ~1.3 KiB).
_BATCH_BYTES = 64 * 1024
# Phase and collective names _pack has checked and sends as given; a loop uses a handful.
MAX_NAMES_REMEMBERED = 1024
# grpc's connectivity poller (behind channel_ready_future) outlives its future by up to 0.2 s and
# raises in its own thread if the channel closes under it: a channel is closed this long after.
_POLLER_S = 0.3
_NEVER = 1 << 62  # a queue length the hot path never reaches: nobody waits (Client._wake_at)
# Full batches queued that wake a sender waiting for a flush: each wake-up costs the training
# process ~0.1 ms of CPU and the agent ~0.2 ms however few markers it brings, so one sends several.
FULL_WAKE_BATCHES = 4
# The marker socket (agent.marker_socket): how long a stopping client waits for the agent's answer, and the
# most bytes that answer (a PushMarkersResponse) takes.
_ANSWER_TIMEOUT_S = 1.0
_ANSWER_BYTES = 64 * 1024

# Why the sender dropped a marker it could not send (``Client.stats()["dropped_invalid_by_reason"]``).
INVALID_REASONS: dict[str, str] = {
    "bad_name": f"a phase or collective name over {MAX_MARKER_NAME_CHARS} characters",
    "bad_step": "a step number that is not an integer of int64 (a negative one is sent: the agent refuses it)",
    "device_event": "the device event of its timestamp failed",
    "encode_error": "a field the wire cannot hold, found only when encoding",
}


class _Invalid(Exception):
    """A queued marker that cannot be sent: ``reason`` (``INVALID_REASONS``) and a phrase naming the problem."""

    def __init__(self, reason: str, problem: str) -> None:
        super().__init__(problem)
        self.reason = reason
        self.problem = problem


def _integer(value: Any) -> int | None:
    """``value`` as an int (anything with ``__index__``, or a float with an integral value), else None."""
    try:
        return operator.index(value)
    except TypeError:
        pass
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(f) if f.is_integer() else None


def _int64(value: Any) -> bool:
    return value.__class__ is int and -_INT64_MAX <= value <= _INT64_MAX


def _plain(step: Any, flops: Any, tokens: Any, nbytes: Any) -> bool:
    """Whether a marker's values go on the wire as they are: int64 ints and a float or int FLOPs."""
    return _int64(step) and (flops.__class__ is float or _int64(flops)) and _int64(tokens) and _int64(nbytes)


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _socket_target(target: str) -> str:
    """``target`` with each surrogate-escaped byte (a path that is not UTF-8) as ``%XX``, which gRPC decodes."""
    return "".join(f"%{ord(c) - 0xDC00:02X}" if "\udc80" <= c <= "\udcff" else c for c in target)


def _said(field: str, given: object, used: _T, problem: str | None, fix: str, level: int = logging.WARNING) -> _T:
    """``used``; logged with the problem and the fix when it replaces a different ``given``."""
    if used != given:
        shown = given[:80] if isinstance(given, str) else given
        logger.log(level, "event=identity_replaced field=%s given=%r used=%r problem=%r fix=%r",
                   field, shown, used, problem, fix)
    return used


class _Step:
    """``with client.step(i)``: STEP_BEGIN on enter, STEP_END (with flops, tokens) on exit."""

    __slots__ = ("_c", "_flops", "_i", "_tokens")

    def __init__(self, client: Client, i: int, flops: float | None, tokens: int | None) -> None:
        self._c = client
        self._i = i
        # 0 for "not given": the wire has no other absent value, and a column of numbers packs in one call.
        self._flops = 0 if flops is None else flops
        self._tokens = 0 if tokens is None else tokens

    def __enter__(self) -> _Step:
        c = self._c
        c._step = self._i
        c._put(_STEP_BEGIN, self._i, "", 0, 0, 0)
        captures = c._captures
        if captures.active:  # two attribute reads when no capture is asked for
            captures.step_begin(self._i)
        return self

    def __exit__(self, *exc: object) -> None:
        # The end marker is written even when the body raised: the window still happened.
        c = self._c
        captures = c._captures
        if captures.active:
            captures.step_end()
        c._put(_STEP_END, self._i, "", self._flops, self._tokens, 0)


class _Phase:
    """``with client.phase(name)``: PHASE_BEGIN/END carrying the name and the current step."""

    __slots__ = ("_c", "_name", "_step")

    def __init__(self, client: Client, name: str) -> None:
        self._c = client
        self._name = name
        self._step = client._step

    def __enter__(self) -> _Phase:
        self._c._put(_PHASE_BEGIN, self._step, self._name, 0, 0, 0)
        return self

    def __exit__(self, *exc: object) -> None:
        self._c._put(_PHASE_END, self._step, self._name, 0, 0, 0)


class _Collective:
    """``with client.collective(name, bytes=n)``: COLLECTIVE_BEGIN/END with the payload bytes."""

    __slots__ = ("_bytes", "_c", "_name", "_step")

    def __init__(self, client: Client, name: str, nbytes: int | None) -> None:
        self._c = client
        self._name = name
        self._bytes = 0 if nbytes is None else nbytes
        self._step = client._step

    def __enter__(self) -> _Collective:
        self._c._put(_COLL_BEGIN, self._step, self._name, 0, 0, self._bytes)
        return self

    def __exit__(self, *exc: object) -> None:
        self._c._put(_COLL_END, self._step, self._name, 0, 0, self._bytes)


class _Stream:
    """Book-keeping of one marker stream (a ``PushMarkers`` call or a marker socket connection), shared by the
    batch generator and the sender thread."""

    __slots__ = ("call", "closed", "confirmed", "inflight", "lock", "sock", "written")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.call: Any = None  # the PushMarkers call, on gRPC
        self.sock: socket.socket | None = None  # the connection, on the marker socket
        self.closed = False
        self.inflight = 0  # markers in the batch yielded to gRPC but not yet confirmed written
        self.confirmed = 0  # batches confirmed written on this stream
        self.written = 0  # markers of those batches, counted as sent


class Client:
    """Marker queue plus the background sender for one training process.

    Identity arguments the wire or the agent cannot take are replaced, with a warning (module
    docstring); ``job``, ``rank``, ``gpu``, ``device_uuid``, ``target`` and ``pid`` hold what is sent.

    Args:
        job: Job id carried in every batch.
        rank: Global rank of this process.
        gpu: The agent's index of the GPU this rank drives, -1 for none or unknown.
        agent: gRPC target of the node agent, e.g. ``unix:///run/chopper/agent.sock``.
        queue_size: Most markers waiting to be sent; beyond it markers are dropped and counted.
        max_batch: Most markers per ``MarkerBatch``.
        flush_interval_s: Longest a non-full batch waits before it is sent, seconds. A trainer
            marking 10 steps a second then wakes the agent 4 times a second rather than 20 (each
            wake-up, cold, costs the agent more than the markers it brings); ``FULL_WAKE_BATCHES``
            full batches (or half the queue) are sent at once.
        initial_backoff_s: First reconnect delay, seconds; doubles per failed attempt.
        max_backoff_s: Cap of the reconnect delay, seconds.
        clock: CLOCK_REALTIME source in ns for CPU timestamps (injectable for tests).
        device_clock: When given, markers carry device-event timestamps (ClockSource DEVICE).
        pid: Process id sent with every batch.
        start: Start the sender thread now (tests may start it later with ``start()``).
        control: Also hold a ``Control`` stream so that ``chopper capture`` can profile this
            process (docs/CAPTURE.md).
        device_uuid: The device's UUID (``MarkerBatch.device_uuid``; docs/IDENTITY.md), "" for none.
        device_source: How ``gpu``/``device_uuid`` were found, for the warning when the agent lacks the device.
        inspector_enabled: Whether NCCL's Inspector profiler plugin runs in this process
            (``MarkerBatch.inspector_enabled``); None reads ``NCCL_INSPECTOR_ENABLE=1`` from the environment.
    """

    def __init__(
        self,
        job: str,
        rank: int,
        gpu: int,
        agent: str,
        queue_size: int = 65536,
        max_batch: int = 512,
        flush_interval_s: float = 0.25,
        initial_backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        clock: Callable[[], int] = time.time_ns,
        device_clock: DeviceClock | None = None,
        pid: int | None = None,
        start: bool = True,
        control: bool = True,
        device_uuid: str = "",
        device_source: str = "",
        inspector_enabled: bool | None = None,
    ) -> None:
        # Identity is made sendable here, once (module docstring), and said so; training goes on.
        given_job = str(job)  # chopper.init(job=SLURM_JOB_ID as an int) is a job name too
        self.job = _said("job", given_job, usable_job_name(given_job), job_name_problem(given_job),
                         "pass chopper.init(job=...) or set CHOPPER_JOB to at most 251 printable characters")
        given_rank = _integer(rank)
        self.rank = _said("rank", rank, given_rank if given_rank is not None and 0 <= given_rank <= MAX_INDEX else 0,
                          f"a rank is an integer from 0 to {MAX_INDEX}", "pass chopper.init(rank=...) or set RANK")
        given_gpu = _integer(gpu)
        self.gpu = _said("gpu", gpu, given_gpu if given_gpu is not None and -1 <= given_gpu <= MAX_INDEX else -1,
                         f"a GPU index is an integer from -1 (none) to {MAX_INDEX}",
                         "pass chopper.init(gpu=...) or set CHOPPER_GPU to the agent's index or the device UUID")
        given_uuid = str(device_uuid)
        self.device_uuid = _said("device_uuid", given_uuid, escape_unprintable(given_uuid)[:MAX_MARKER_NAME_CHARS],
                                 "a device UUID is printable text", "fix the visibility variable named in source")
        self.device_source = escape_unprintable(str(device_source))
        given_target = str(agent)
        self.target = _said("agent", given_target, _socket_target(given_target),
                            "the socket path holds bytes that are not UTF-8",
                            "none needed: gRPC decodes %XX in a unix socket path", level=logging.INFO)
        unix_path = local_socket.unix_path(given_target)
        self._marker_path = marker_socket_path(unix_path) if unix_path else ""
        given_pid = os.getpid() if pid is None else pid
        wire_pid = _integer(given_pid)
        self.pid = _said("pid", given_pid, wire_pid if wire_pid is not None and abs(wire_pid) <= _INT64_MAX
                         else os.getpid(), "a pid is an integer of int64", "pass no pid: the client reads its own")
        self.inspector_enabled = (os.environ.get("NCCL_INSPECTOR_ENABLE", "").strip() == "1"
                                  if inspector_enabled is None else bool(inspector_enabled))
        # Every local process reaches the agent as the same unix peer: saying which one it is
        # gives it a stream budget of its own (chopper/daemon/access.py).
        self._peer_metadata = ((PID_METADATA, str(os.getpid())),)
        self._q: deque[Item] = deque()
        self._cap = max(0, int(queue_size))
        self._max_batch = min(max(1, int(max_batch)), MAX_MARKERS_PER_BATCH)  # larger batches are refused
        self._flush_s = flush_interval_s
        self._initial_backoff = initial_backoff_s
        self._max_backoff = max(max_backoff_s, initial_backoff_s)
        self._device = device_clock
        self._now: Callable[[], Any] = device_clock.record if device_clock is not None else clock
        self._step = 0
        # Hot-path counters (training threads). Lost increments under thread races are
        # acceptable: they are statistics, and a lock would cost more than the marker.
        self._queued = 0
        self._dropped_full = 0
        self._dropped_error = 0
        # Sender-side counters (generator and sender thread, serialised by _Stream.lock).
        self._sent = 0
        self._batches_sent = 0
        self._seq = 0
        self._dropped_inflight = 0
        self._dropped_abandoned = 0
        self._dropped_invalid = 0
        self._invalid: Counter[str] = Counter()  # the same markers by reason (INVALID_REASONS)
        self._fields_dropped: Counter[str] = Counter()  # flops/tokens/bytes left out, marker sent
        self._names_ok: set[str] = {""}  # names _pack sends as given (_checked_name); a step has ""
        self._warned_problems: set[str] = set()  # each marker problem is logged once per client
        self._connected = False
        self._last_error = ""
        self._warned = False
        self._stopping = False
        self._stop_event = threading.Event()  # set when shutdown starts: no more waiting to batch
        # The sender sleeps on _wake; the hot path sets it when the queue already holds _wake_at markers
        # (0 while the sender waits on an empty queue, _wake_full - 1 while a partial batch waits for
        # its flush, _NEVER while the sender runs), so a fast loop's markers go without waiting for
        # the flush, FULL_WAKE_BATCHES full batches a wake-up (below half the queue, so none is dropped).
        self._wake = threading.Event()
        self._wake_at = _NEVER
        self._wake_full = max(1, min(FULL_WAKE_BATCHES * self._max_batch, self._cap // 2))
        self._abort_event = threading.Event()  # set when shutdown gives up: leave at once
        self._done = threading.Event()  # set when the sender has finished (counters are final)
        self._channel: Any = None
        self._stream: _Stream | None = None
        self._thread: threading.Thread | None = None
        # On-demand capture (chopper.profiler): the steps call its hooks only while it is active.
        self._control = control
        self._captures = CaptureControl(self.target, self.job, self.rank, self.pid, self._peer_metadata,
                                        initial_backoff_s, self._max_backoff,
                                        control_path=control_socket_path(unix_path) if unix_path else "")
        self.capture_results = self._captures.results
        if start:
            self.start()

    # ----------------------------------------------------------------------------- hot path

    def _put(self, kind: int, step: int, name: str, flops: Any, tokens: Any, nbytes: Any) -> None:
        """Queue one marker; drop and count when full or on any error. Never raises."""
        try:
            q = self._q
            held = len(q)
            if held < self._cap:
                q.append((kind, self._now(), step, name, flops, tokens, nbytes))
                self._queued += 1
                if held >= self._wake_at:  # the sender waits for this marker (__init__)
                    self._wake_at = _NEVER
                    self._wake.set()
            else:
                self._dropped_full += 1
        except Exception:
            self._dropped_error += 1

    def step(self, i: int, flops: float | None = None, tokens: int | None = None) -> _Step:
        """Context manager around training step ``i``; ``flops``/``tokens`` go on STEP_END."""
        return _Step(self, i, flops, tokens)

    def phase(self, name: str) -> _Phase:
        """Context manager around a phase (``forward``, ``backward``, ``optimizer``...)."""
        return _Phase(self, name)

    def collective(self, name: str, bytes: int | None = None) -> _Collective:
        """Context manager around a collective (``all_reduce``...) of ``bytes`` payload bytes."""
        return _Collective(self, name, bytes)

    # ------------------------------------------------------------------------------ control

    def start(self) -> None:
        """Start the sender thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="chopper-sender", daemon=True)
            self._thread.start()
        if self._control:
            self._captures.start()

    def stats(self) -> dict[str, Any]:
        """Counters since construction.

        Returns:
            ``queued``: markers accepted into the queue; ``pending``: waiting now; ``sent``:
            markers in batches handed to the transport; ``batches_sent``; ``dropped``: all
            markers lost, with the split ``dropped_queue_full``, ``dropped_error`` (internal
            error on the hot path), ``dropped_invalid`` (could not be sent, see
            ``dropped_invalid_by_reason``, keys of ``INVALID_REASONS``),
            ``dropped_in_flight`` (batch in flight when a stream broke) and
            ``dropped_at_shutdown``; ``fields_dropped``: by field (``flops``, ``tokens``,
            ``bytes``), values that were not numbers, left out of markers that were sent;
            ``connected``: a stream is open; ``last_error``: the last stream, connection or
            sender failure, ``""`` if none. Once ``shutdown`` has returned (or the sender has
            exited), ``queued == sent + dropped_invalid + dropped_in_flight + dropped_at_shutdown``.
        """
        dropped = self._dropped_total()
        return {
            "queued": self._queued,
            "pending": len(self._q),
            "sent": self._sent,
            "dropped": dropped,
            "dropped_queue_full": self._dropped_full,
            "dropped_error": self._dropped_error,
            "dropped_invalid": self._dropped_invalid,
            # Copied in one C call: the sender may add a key meanwhile.
            "dropped_invalid_by_reason": dict(self._invalid),
            "fields_dropped": dict(self._fields_dropped),
            "dropped_in_flight": self._dropped_inflight,
            "dropped_at_shutdown": self._dropped_abandoned,
            "batches_sent": self._batches_sent,
            "connected": self._connected,
            "last_error": self._last_error,
        }

    def _dropped_total(self) -> int:
        return (
            self._dropped_full + self._dropped_error + self._dropped_invalid
            + self._dropped_inflight + self._dropped_abandoned
        )

    def shutdown(self, timeout: float = 2.0) -> None:
        """Flush what can be sent within ``timeout`` seconds, then stop. Never hangs or raises.

        Markers made after this call are dropped and counted.
        """
        try:
            self._stop_event.set()
            self._captures.shutdown()
        except Exception:
            logger.debug("event=capture_shutdown_error", exc_info=True)
        try:
            self._cap = 0
            self._stopping = True
            self._stop_event.set()
            self._wake.set()  # a sender asleep on an empty queue flushes and ends now
            if self._thread is None:
                self._abandon()
                self._done.set()
                return
            if not self._done.wait(max(0.0, timeout)):
                # Flushing did not finish (agent gone or stuck): cancel the call so the sender
                # exits; it is a daemon thread, so a wedged one cannot hold the process either.
                self._abort_event.set()
                self._cancel()
                if not self._done.wait(0.5):
                    self._close_stream(lock_timeout=0.1)  # a wedged sender's batch in flight is lost
            # A marker whose _put passed the size check before _cap fell to 0 lands after the
            # sender's last look at the queue.
            self._abandon()
        except Exception:
            logger.debug("event=shutdown_error", exc_info=True)

    # ------------------------------------------------------------------------------ sender

    def _cancel(self) -> None:
        # Only the call: the sender closes the channel itself (see _run).
        try:
            stream = self._stream
            if stream is not None and stream.call is not None:
                stream.call.cancel()
            if stream is not None and stream.sock is not None:
                stream.sock.shutdown(socket.SHUT_RDWR)  # a send blocked on a full queue returns
        except Exception:
            logger.debug("event=cancel_error", exc_info=True)

    def _abandon(self) -> None:
        """Count everything still queued as dropped (called once the sender cannot send)."""
        n = 0
        q = self._q
        while True:
            try:
                q.popleft()
            except IndexError:
                break
            n += 1
        self._dropped_abandoned += n

    def _run(self) -> None:
        """Sender thread: ``_serve`` until it has flushed or was aborted; a failure is logged once and retried."""
        backoff = self._initial_backoff
        try:
            while True:
                try:
                    self._serve()
                    return
                except Exception as e:
                    if self._abort_event.is_set():  # errors from the channel closed under it are expected
                        return
                    self._close_stream()
                    self._failed(f"{type(e).__name__}: {e}")
                    if self._stopping:
                        return
                    self._abort_event.wait(max(backoff, _POLLER_S))
                    self._close_channel()
                    backoff = min(backoff * 2, self._max_backoff)
        except BaseException as e:  # the sender must never take the process down
            self._failed(f"{type(e).__name__}: {e}")
        finally:
            self._connected = False
            self._close_stream()
            self._abandon()
            self._done.set()
            # shutdown() waits on _done, not on this thread, so the pause costs the trainer nothing.
            time.sleep(_POLLER_S)
            self._close_channel()

    def _failed(self, error: str) -> None:
        self._last_error = error
        if "sender_failed" not in self._warned_problems:
            self._warned_problems.add("sender_failed")
            logger.warning("event=sender_failed target=%r error=%r note='retried every %.1f s at most; markers wait in "
                           "the bounded queue, overflow is dropped and counted'", self.target, error, self._max_backoff)

    def _close_stream(self, lock_timeout: float = -1) -> None:
        """Close the current stream's book-keeping: its batch in flight is counted as dropped, once."""
        stream = self._stream
        if stream is None or not stream.lock.acquire(timeout=lock_timeout):
            return
        try:
            stream.closed = True
            self._dropped_inflight += stream.inflight
            stream.inflight = 0
        finally:
            stream.lock.release()

    def _close_channel(self) -> None:
        channel, self._channel = self._channel, None
        with contextlib.suppress(Exception):
            if channel is not None:
                channel.close()

    def _disconnected(self, reason: str) -> None:
        self._connected = False
        self._last_error = reason
        if not self._warned:
            self._warned = True
            logger.warning(
                "event=agent_unreachable target=%r error=%r pending=%d dropped=%d "
                "note=markers wait in a bounded queue; overflow is dropped and counted",
                self.target, reason, len(self._q), self._dropped_total(),
            )

    def _serve(self) -> None:
        import grpc

        from chopper.proto.chopper.v1 import agent_pb2, agent_pb2_grpc

        options = [
            # Reconnect quickly after an agent restart; the agent is local, so a short cap is cheap.
            ("grpc.initial_reconnect_backoff_ms", max(1, int(self._initial_backoff * 1000))),
            ("grpc.max_reconnect_backoff_ms", max(1, int(self._max_backoff * 1000))),
            # Retries would buffer a client stream in memory; we do our own reconnect.
            ("grpc.enable_retries", 0),
            # A dead local agent closes the socket, which the stream sees at once. Keepalive only
            # catches a wedged peer, and must stay above the server's default 5 min minimum ping
            # interval: the agent sends nothing during the stream, so faster pings earn GOAWAY.
            ("grpc.keepalive_time_ms", 360_000),
            ("grpc.keepalive_timeout_ms", 20_000),
        ]
        channel = grpc.insecure_channel(self.target, options=options)
        self._channel = channel
        stub = agent_pb2_grpc.AgentStub(channel)
        backoff = self._initial_backoff
        device_checked = False
        while not self._abort_event.is_set():
            if self._stopping and not self._q:
                return
            sock = local_socket.connect(self._marker_path)  # a full queue blocks this thread only
            if sock is None and not self._await_ready(grpc, channel, backoff):
                self._disconnected(f"agent not ready within {backoff:.3f}s")
                backoff = min(backoff * 2, self._max_backoff)
                continue
            if not device_checked:
                device_checked = True
                with contextlib.suppress(Exception):  # only a warning: never a reason not to send
                    self._check_device(stub, agent_pb2)
            stream = _Stream()
            self._stream = stream
            self._connected = True
            if sock is not None:
                finished = self._stream_socket(stream, sock, agent_pb2)
            else:
                finished = self._stream_grpc(stream, stub, agent_pb2)
            if finished:
                return
            if stream.confirmed:
                # The agent took data, so this was a restart or a hiccup: reconnect at once.
                backoff = self._initial_backoff
            else:
                # Streams that end before carrying anything must not spin.
                self._abort_event.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    def _stream_grpc(self, stream: _Stream, stub: Any, pb2: Any) -> bool:
        """One ``PushMarkers`` call; True when it ended because the client is stopping and all was sent."""
        done = threading.Event()
        call = stub.PushMarkers.future(self._requests(stream, pb2), wait_for_ready=False,
                                       metadata=self._peer_metadata)
        stream.call = call
        call.add_done_callback(lambda _f, done=done: done.set())
        while not done.wait(0.1):
            if self._abort_event.is_set():
                call.cancel()
        self._close_stream()
        self._connected = False
        try:
            self._log_response(call.result(timeout=0))
            return self._stopping
        except Exception as e:
            self._unsend_if_unread(stream, call)
            code = getattr(e, "code", None)
            details = getattr(e, "details", None)
            self._disconnected(f"{code().name}: {details()}" if callable(code) and callable(details) else repr(e))
            return False

    def _stream_socket(self, stream: _Stream, sock: socket.socket, pb2: Any) -> bool:
        """One stream over the marker socket: each batch one datagram, sent from ``_requests``' batches.

        A batch counts as sent when the kernel took the datagram (the generator is resumed only then);
        one whose send failed was not queued, and ``_close_stream`` counts it as dropped. At the end
        of a stopping client's queue the write side is shut down and the agent's answer read.

        Returns:
            True when the stream ended because the client is stopping and all was sent.
        """
        stream.sock = sock
        batches = self._requests(stream, pb2)
        try:
            for batch in batches:
                sock.send(batch.SerializeToString(), socket.MSG_NOSIGNAL)
            if not self._stopping or self._q:
                return False  # aborted
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(_ANSWER_TIMEOUT_S)
            response = pb2.PushMarkersResponse()
            response.ParseFromString(sock.recv(_ANSWER_BYTES))
            self._log_response(response)
            return True
        except OSError as e:
            if not self._stopping or self._q:
                self._disconnected(f"marker socket: {e.strerror or e}")
            return self._stopping and not self._q
        finally:
            batches.close()
            self._close_stream()
            self._connected = False
            sock.close()

    def _log_response(self, response: Any) -> None:
        """Warn about markers the agent rejected, as its stream's ``PushMarkersResponse`` says."""
        if response.rejected:
            logger.warning("event=markers_rejected target=%r rejected=%d errors=%r",
                           self.target, response.rejected, list(response.errors)[:3])

    def _unsend_if_unread(self, stream: _Stream, call: Any) -> None:
        """A stream the agent refused before reading it: what was written on it is dropped, not sent.

        A write completes once gRPC has buffered it, which can be before the agent's refusal
        arrives; the refusal's trailing metadata says that nothing of the stream was taken in.
        """
        try:
            unread = any(key == UNREAD_METADATA for key, _ in call.trailing_metadata() or ())
        except Exception:
            return
        if unread:
            with stream.lock:
                self._sent -= stream.written
                self._dropped_inflight += stream.written
                stream.written = 0

    def _check_device(self, stub: Any, pb2: Any) -> None:
        """Once per client: warn, naming what chose the device, when the agent has no such device.

        The agent flags such a rank's steps ``unknown_device`` whatever happens here; this warning
        is for the training log, where the variable that chose the device is known.
        """
        if (self.gpu < 0 and not self.device_uuid) or self.device_uuid.startswith(UNRESOLVED):
            return  # no GPU, or already warned at init
        try:
            info = stub.GetInfo(pb2.GetInfoRequest(), timeout=2.0)
        except Exception:  # an older or busy agent: it still flags the steps itself
            return
        if self.device_uuid:
            uuids = {canonical_uuid(d.uuid): d.gpu for d in info.devices if d.uuid}
            if match_uuid(self.device_uuid, uuids) is not None:
                return
            problem = f"device UUID {self.device_uuid} is not a GPU of node {info.node!r}"
        elif any(d.gpu == self.gpu for d in info.devices):
            return
        else:
            problem = f"GPU {self.gpu} is not a GPU of node {info.node!r} ({len(info.devices)} GPUs)"
        logger.warning("event=unknown_device job=%r rank=%d problem=%r source=%r note='its steps are flagged "
                       "unknown_device; fix the variable named in source, or set CHOPPER_GPU to the agent index "
                       "or UUID'", self.job, self.rank, problem, self.device_source)

    def _await_ready(self, grpc: Any, channel: Any, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the channel to be READY, in short slices so abort is seen."""
        future = grpc.channel_ready_future(channel)
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                try:
                    future.result(timeout=max(0.0, min(0.05, remaining)))
                    return True
                except grpc.FutureTimeoutError:
                    if self._abort_event.is_set() or time.monotonic() >= deadline:
                        return False
        finally:
            future.cancel()

    def _requests(self, stream: _Stream, pb2: Any) -> Generator[agent_pb2.MarkerBatch, None, None]:
        """Request iterator of one stream; runs on gRPC's request-consumer thread.

        An error of ours ends the stream cleanly (logged once) instead of as gRPC's "Exception
        iterating requests": the batch in flight is then counted by ``_close_stream``.
        """
        try:
            yield from self._batches(stream, pb2)
        except Exception as e:
            self._failed(f"{type(e).__name__}: {e}")

    def _batches(self, stream: _Stream, pb2: Any) -> Iterator[agent_pb2.MarkerBatch]:
        last_flush = time.monotonic()
        while True:
            batch = None
            with stream.lock:
                if stream.closed:
                    return
                if stream.inflight:
                    # gRPC asks for the next message only after the previous write completed.
                    self._sent += stream.inflight
                    stream.written += stream.inflight
                    self._batches_sent += 1
                    stream.inflight = 0
                    stream.confirmed += 1
                    if self._warned:
                        self._warned = False
                        logger.info("event=agent_connected target=%r", self.target)
                call = stream.call
                if call is not None and call.done():
                    return
                q = self._q
                now = time.monotonic()
                if q and (
                    len(q) >= self._max_batch or self._stopping or now - last_flush >= self._flush_s
                ):
                    batch = self._pack(pb2)
                    if batch is not None:
                        stream.inflight = marker_count(batch)
                        last_flush = now
            if batch is not None:
                yield batch
                continue
            if self._abort_event.is_set():
                return
            if self._stopping:
                if not self._q:
                    return
                # Only unresolved device events remain: poll for them until shutdown's timeout.
                time.sleep(0.002)
            elif self._q:  # not a full batch yet: until its flush is due, or a wake-up's worth is queued
                self._wait_for(self._wake_full, max(0.001, self._flush_s - (time.monotonic() - last_flush)))
            else:
                # Nothing queued: sleep until the first marker. Waiting only until the last flush's
                # interval ran out spun at 1 kHz when idle.
                self._wait_for(1, self._flush_s)

    def _wait_for(self, markers: int, timeout_s: float) -> None:
        """Sleep until the queue holds ``markers`` markers, shutdown starts, or ``timeout_s`` passed.

        The threshold is set before the queue is looked at again, so a marker that comes between
        the caller's check and the sleep either is seen here or sets the event.
        """
        self._wake.clear()
        self._wake_at = markers - 1
        if len(self._q) < markers and not self._stop_event.is_set():
            self._wake.wait(timeout_s)
        self._wake_at = _NEVER

    def _pack(self, pb2: Any) -> agent_pb2.MarkerBatch | None:
        """Pop up to ``max_batch`` markers (``_BATCH_BYTES`` at most) from the queue head into a ``MarkerBatch``.

        In column form (``_pack_columns``) when it can, else as one ``Marker`` each (``_pack_markers``);
        None when no marker could be sent.
        """
        batch = pb2.MarkerBatch()
        count = 0 if self._device is not None else self._pack_columns(batch.columns)
        if not count:
            batch.ClearField("columns")
            count = self._pack_markers(batch, pb2)
        if not count:
            return None
        try:
            batch.job, batch.rank, batch.gpu, batch.pid = self.job, self.rank, self.gpu, self.pid
            batch.seq = self._seq + 1
            batch.client_dropped_total = self._dropped_total()
            batch.device_uuid = self.device_uuid
            batch.inspector_enabled = self.inspector_enabled
        except Exception as e:  # markers already popped are counted, never lost
            self._drop_invalid("encode_error", count, f"{type(e).__name__}: {e}")
            return None
        self._seq += 1
        return batch

    def _pack_columns(self, columns: Any) -> int:
        """Pop the queue head into ``columns`` (a ``MarkerColumns``), one call per column; how many went.

        Algorithm:
            1. Take up to ``max_batch`` markers off the head (not yet popped) and split them into
               columns (``zip``, in C).
            2. Go on only if every distinct name was checked before (``_names_ok``); a new name
               goes through ``_pack_markers``, which checks and remembers it, so the next batch
               is columns again.
            3. Keep as many markers as ``_BATCH_BYTES`` holds at ``_COLUMN_MARKER_BYTES`` each
               beside the batch's names.
            4. Extend each column at once: protobuf checks the values as it takes them, and one
               it refuses (a step beyond int64, FLOPs that are no number) leaves the markers to
               ``_pack_markers``, which drops or fixes that one alone. ``flops``, ``tokens`` and
               ``bytes`` are left empty where all are 0, ``clock`` always (every stamp is the CPU's:
               with a device clock this is not called).
            5. Only then pop them.

        Returns 0, with ``columns`` empty and nothing popped, when step 2 or 4 refused the batch.
        """
        q = self._q
        count = min(len(q), self._max_batch)
        try:
            kinds, stamps, steps, names, flops, tokens, nbytes = zip(*itertools.islice(q, count), strict=True)
            distinct = dict.fromkeys(names)
            # str exactly: an enum member equal to a checked name may be sent as another text (str(member)).
            if not self._names_ok.issuperset(distinct) or any(name.__class__ is not str for name in distinct):
                return 0
            fit = (_BATCH_BYTES - 4 * sum(map(len, distinct))) // _COLUMN_MARKER_BYTES
            if fit < count:
                count = fit
                kinds, stamps, steps, names, flops, tokens, nbytes = (
                    c[:count] for c in (kinds, stamps, steps, names, flops, tokens, nbytes))
                distinct = dict.fromkeys(names)
            if count <= 0:
                return 0
            index = {name: i for i, name in enumerate(distinct)}
            columns.ts_ns.extend(stamps)
            columns.kind.extend(kinds)
            columns.step.extend(steps)
            columns.name.extend(map(index.__getitem__, names))
            columns.names.extend(distinct)
            for column, values in ((columns.flops, flops), (columns.tokens, tokens), (columns.bytes, nbytes)):
                if any(values):
                    column.extend(values)
        except Exception:  # unhashable names, values protobuf refuses: each is dealt with alone
            columns.Clear()
            return 0
        popleft = q.popleft
        for _ in range(count):
            popleft()
        return count

    def _pack_markers(self, batch: Any, pb2: Any) -> int:
        """Pop the queue head into ``batch.markers``, one ``Marker`` each; how many went.

        Stops at the first device event the GPU has not reached, so markers stay in order. Each
        marker is checked as the module docstring says; one that cannot be sent is dropped and
        counted by reason, never its batch. A marker whose name was sent before and whose values
        are plain ints and floats within int64 (nearly all) is written straight into the batch;
        any other goes through ``_marker``'s per-field checks.
        """
        q = self._q
        device = self._device
        names_ok = self._names_ok
        add = batch.markers.add
        count = 0
        room = _BATCH_BYTES
        try:
            while q and count < self._max_batch:
                kind, ts, step, name, flops, tokens, nbytes = q[0]
                try:
                    if name.__class__ is not str or name not in names_ok:  # str first: others may not hash
                        name = self._checked_name(kind, step, name)
                    size = _MARKER_BYTES + 4 * len(name)
                    if count and size > room:
                        break  # the next batch takes it
                    clock = _CPU
                    if device is not None and ts.__class__ is not int:
                        try:
                            resolved = device.resolve(ts)
                        except Exception as e:
                            raise _Invalid("device_event", f"{type(e).__name__}: {e}") from e
                        if resolved is None:
                            break
                        ts, clock = resolved, _DEVICE
                except Exception as e:
                    q.popleft()
                    self._drop_for(e)
                    continue
                q.popleft()
                if _plain(step, flops, tokens, nbytes):
                    m = add(ts_ns=ts, kind=kind, step=step, name=name, clock=clock)
                    if flops:
                        m.flops = flops
                    if tokens:
                        m.tokens = tokens
                    if nbytes:
                        m.bytes = nbytes
                else:
                    try:
                        batch.markers.append(self._marker(pb2.Marker, kind, ts, step, name, clock, flops, tokens,
                                                          nbytes))
                    except Exception as e:
                        self._drop_for(e)
                        continue
                count += 1
                room -= size
        except Exception as e:  # markers already popped are counted, never lost
            self._drop_invalid("encode_error", count, f"{type(e).__name__}: {e}")
            return 0
        return count

    def _checked_name(self, kind: int, step: Any, name: Any) -> str:
        """``_wire_name``, remembering names that go as given (``MAX_NAMES_REMEMBERED`` at most)."""
        wire = self._wire_name(kind, step, name)
        if wire is name and len(self._names_ok) < MAX_NAMES_REMEMBERED:
            self._names_ok.add(name)
        return wire

    def _wire_name(self, kind: int, step: Any, name: Any) -> str:
        """The name to send (escaped when unprintable); raises ``_Invalid`` for one over the limit."""
        if name.__class__ is not str:
            name = str(name)  # an enum member or a number names a phase too
        if not name or marker_name_problem(name) is None:
            return name
        escaped = escape_unprintable(name)
        problem = marker_name_problem(escaped)
        if problem is not None:
            raise _Invalid("bad_name", f"{MarkerKind(kind).label} of step {step}: {problem} "
                                       f"(it begins {name[:40]!r}); name it with at most {MAX_MARKER_NAME_CHARS} "
                                       "characters")
        self._warn_once("name_escaped", "event=marker_name_escaped given=%r used=%r note='unprintable characters "
                        "are sent escaped; name phases and collectives with printable text'", name[:80], escaped[:80])
        return escaped

    def _marker(self, marker_cls: Any, kind: int, ts: int, step: Any, name: str, clock: int, flops: Any,
                tokens: Any, nbytes: Any) -> Any:
        """One ``Marker``; a payload value that is not a number is left out (counted), never the marker."""
        try:
            m = marker_cls(ts_ns=ts, kind=kind, step=step, name=name, clock=clock)
        except Exception:
            whole = _integer(step)
            if whole is None or not -_INT64_MAX <= whole <= _INT64_MAX:
                raise _Invalid("bad_step", f"{MarkerKind(kind).label} has step {str(step)[:40]!r}, not an integer "
                                           "of int64; pass the step number as an int") from None
            m = marker_cls(ts_ns=ts, kind=kind, step=whole, name=name, clock=clock)
        if flops is not None:
            self._set(m, "flops", flops, _number)
        if tokens is not None:
            self._set(m, "tokens", tokens, _integer)
        if nbytes is not None:
            self._set(m, "bytes", nbytes, _integer)
        return m

    def _set(self, m: Any, field: str, value: Any, convert: Callable[[Any], Any]) -> None:
        try:
            setattr(m, field, value)
            return
        except Exception:
            pass
        converted = convert(value)
        if converted is not None:
            try:
                setattr(m, field, converted)
                return
            except Exception:
                pass
        self._fields_dropped[field] += 1
        self._warn_once(f"field_{field}", "event=marker_field_dropped field=%s value=%r note='the marker is sent "
                        "without it; pass a number (an integer for tokens and bytes, within int64)'",
                        field, repr(value)[:80])

    def _drop_for(self, error: Exception) -> None:
        """Count one popped marker that ``error`` kept from being sent."""
        if isinstance(error, _Invalid):
            self._drop_invalid(error.reason, 1, error.problem)
        else:
            self._drop_invalid("encode_error", 1, f"{type(error).__name__}: {error}")

    def _drop_invalid(self, reason: str, count: int, problem: str) -> None:
        self._dropped_invalid += count
        self._invalid[reason] += count
        self._warn_once(f"invalid_{reason}", "event=marker_dropped reason=%s problem=%r count=%d note='%s; the rest of "
                        "its batch is sent; counted in dropped_invalid'", reason, problem, count,
                        INVALID_REASONS[reason])

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned_problems:
            self._warned_problems.add(key)
            logger.warning(message, *args)
