"""Which step summaries an aggregator replica has taken in: deduplication and acknowledgements.

Pure and thread-safe: the ``Deliver`` servicer calls ``Ledger.accept`` once per ``SummaryBatch``
and answers with the ``DeliveryAck`` it returns; nothing here does I/O.

Protocol (``chopper/proto/chopper/v1/aggregator.proto``, agent side in ``agent/delivery.py``):

1. Each agent process (an *incarnation*, random id) numbers its step summaries 1, 2, 3, ... in
   one buffer. Summaries are routed by job to exactly one replica, so the numbers one replica
   sees from one incarnation are increasing but **not contiguous**: the gaps belong to other
   replicas (or were lost, which the agent declares in ``lost_total``).
2. An agent keeps **one** ``Deliver`` stream per replica and sends on it in increasing order.
   After a reconnect it resends, in order, everything routed to this replica after the last
   acknowledgement it *received*, which is never above what the replica has taken in.
3. Hence every stream delivers a prefix-closed run of the agent's numbers for this replica:
   when the replica has taken in number ``m``, it has also taken in every lower number routed to
   it (all were sent before ``m`` on the same ordered stream, or acknowledged earlier). So the
   state per incarnation is one integer, the highest number taken in (``max_seq``):

   - a number ``<= max_seq`` is a duplicate (a resend whose acknowledgement was lost in the cut);
   - a number ``> max_seq`` is new;
   - the acknowledgement is ``max_seq``: every number up to it was taken in, routed elsewhere or
     declared lost. No set of out-of-order numbers is needed because the stream is ordered; a
     number out of order would break rule 2 and is dropped as a duplicate, never double-counted.

4. ``lost_total`` in a batch is the agent's cumulative count, for this incarnation and this
   replica, of summaries its buffer overwrote before this replica acknowledged them; the ledger
   keeps the largest value seen (batches may be resent) and sums it over incarnations.
5. A batch with no summaries is a handshake: it returns the current acknowledgement, so an agent
   that reconnects learns at once what was taken in before the cut. Servicers must answer it.

The ledger recognises resends within one incarnation, and its acknowledgements are exact. A step
that reaches the replica again another way (a new incarnation summarizing the same markers, a
forgotten incarnation, a second agent name) is new here; the job table's step index
(``aggregator/stepindex.py``) recognises it by ``(job, rank, step)`` and content, so it is still
taken in, and acknowledged, once.

Memory is bounded: one small record per incarnation, at most ``max_incarnations_per_agent`` per
agent name (an agent that restarts gets a new incarnation; the oldest is forgotten) and
``max_incarnations`` in all (least recently used forgotten). A forgotten incarnation's declared
loss stays in ``lost_total``.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

MAX_INCARNATIONS_PER_AGENT = 8
MAX_INCARNATIONS = 100_000


@dataclass(slots=True)
class _Incarnation:
    agent: str
    max_seq: int = 0
    lost_total: int = 0


class Ledger:
    """Deduplicates step summaries per ``(agent, incarnation)`` and computes acknowledgements.

    Args:
        max_incarnations_per_agent: Incarnations remembered per agent name (newest kept).
        max_incarnations: Incarnations remembered in all (most recently used kept).
    """

    def __init__(
        self, max_incarnations_per_agent: int = MAX_INCARNATIONS_PER_AGENT, max_incarnations: int = MAX_INCARNATIONS
    ) -> None:
        if max_incarnations_per_agent < 1 or max_incarnations < 1:
            raise ValueError("a ledger must remember at least one incarnation")
        self._per_agent = max_incarnations_per_agent
        self._max = max_incarnations
        self._lock = threading.Lock()
        # Ordered by last use, oldest first, for eviction.
        self._incarnations: OrderedDict[tuple[str, str], _Incarnation] = OrderedDict()
        # Incarnation keys per agent, oldest first.
        self._by_agent: dict[str, OrderedDict[str, None]] = {}
        self._received = 0
        self._duplicates = 0
        self._forgotten_lost = 0

    def accept(self, agent: str, incarnation: str, seqs: list[int], lost_total: int) -> tuple[list[int], int]:
        """Take in one batch.

        Args:
            agent: The agent's stable name (its node).
            incarnation: Random id of the agent process.
            seqs: Sequence number of each summary of the batch, in order (may be empty).
            lost_total: The agent's cumulative loss for this incarnation towards this replica.

        Returns:
            ``(new, acked_seq)``: indices into ``seqs`` of the summaries not seen before (store
            these, in this order), and the number to acknowledge.
        """
        key = (agent, incarnation)
        with self._lock:
            inc = self._incarnations.get(key)
            if inc is None:
                inc = self._add(key)
            else:
                self._incarnations.move_to_end(key)
            new: list[int] = []
            top = inc.max_seq
            for i, seq in enumerate(seqs):
                if seq > top:
                    new.append(i)
                    top = seq
            inc.max_seq = top
            if lost_total > inc.lost_total:
                inc.lost_total = lost_total
            self._received += len(new)
            self._duplicates += len(seqs) - len(new)
            return new, top

    def restore(self, agent: str, incarnation: str, max_seq: int, lost_total: int) -> None:
        """Merge a remembered state (write-ahead log replay) without counting it as received.

        An empty ``agent`` carries the declared loss of incarnations forgotten before.
        """
        with self._lock:
            if not agent:
                self._forgotten_lost = max(self._forgotten_lost, lost_total)
                return
            key = (agent, incarnation)
            inc = self._incarnations.get(key)
            if inc is None:
                inc = self._add(key)
            else:
                self._incarnations.move_to_end(key)
            inc.max_seq = max(inc.max_seq, max_seq)
            inc.lost_total = max(inc.lost_total, lost_total)

    def snapshot(self) -> list[tuple[str, str, int, int]]:
        """``(agent, incarnation, max_seq, lost_total)`` of every incarnation, least recently used first,
        then ``("", "", 0, forgotten loss)``: ``restore`` of each rebuilds this ledger."""
        with self._lock:
            out = [(k[0], k[1], i.max_seq, i.lost_total) for k, i in self._incarnations.items()]
            out.append(("", "", 0, self._forgotten_lost))
            return out

    def acked(self, agent: str, incarnation: str) -> int:
        """The acknowledgement for an incarnation (0 when unknown)."""
        with self._lock:
            inc = self._incarnations.get((agent, incarnation))
            return 0 if inc is None else inc.max_seq

    def stats(self) -> dict[str, int]:
        """Counters for metrics: ``received_total``, ``duplicate_total``, ``lost_total``, ``incarnations``."""
        with self._lock:
            return {
                "received_total": self._received,
                "duplicate_total": self._duplicates,
                "lost_total": self._forgotten_lost + sum(i.lost_total for i in self._incarnations.values()),
                "incarnations": len(self._incarnations),
            }

    def _add(self, key: tuple[str, str]) -> _Incarnation:
        """Record a new incarnation, forgetting the oldest beyond the bounds (caller holds the lock)."""
        agent, incarnation = key
        inc = _Incarnation(agent)
        self._incarnations[key] = inc
        keys = self._by_agent.setdefault(agent, OrderedDict())
        keys[incarnation] = None
        while len(keys) > self._per_agent:
            oldest, _ = keys.popitem(last=False)
            self._forget((agent, oldest))
        while len(self._incarnations) > self._max:
            self._forget(next(iter(self._incarnations)))
        return inc

    def _forget(self, key: tuple[str, str]) -> None:
        inc = self._incarnations.pop(key)
        self._forgotten_lost += inc.lost_total
        keys = self._by_agent.get(key[0])
        if keys is not None:
            keys.pop(key[1], None)
            if not keys:
                del self._by_agent[key[0]]
