"""The ledger dedupes an ordered per-replica stream, acks the highest number taken in, counts declared loss."""
from __future__ import annotations

import threading

import pytest

from aggregator.ledger import Ledger


def test_new_numbers_are_taken_in_and_acked() -> None:
    ledger = Ledger()
    assert ledger.accept("n1", "i1", [1, 2, 3], 0) == ([0, 1, 2], 3)
    # Numbers of other replicas' jobs are skipped: the stream is increasing, not contiguous.
    assert ledger.accept("n1", "i1", [5, 9], 0) == ([0, 1], 9)
    assert ledger.stats() == {"received_total": 5, "duplicate_total": 0, "lost_total": 0, "incarnations": 1}


def test_resend_after_reconnect_drops_what_was_taken_in() -> None:
    ledger = Ledger()
    ledger.accept("n1", "i1", [1, 2, 3, 4], 0)
    # The ack of [1..4] was lost in the cut: the agent resends from its last ack (2) onward.
    new, acked = ledger.accept("n1", "i1", [3, 4, 6, 7], 0)
    assert (new, acked) == ([2, 3], 7)
    assert ledger.stats()["duplicate_total"] == 2
    assert ledger.stats()["received_total"] == 6


def test_empty_batch_is_a_handshake_answering_the_current_ack() -> None:
    ledger = Ledger()
    assert ledger.accept("n1", "i1", [], 0) == ([], 0)
    ledger.accept("n1", "i1", [4, 8], 0)
    assert ledger.accept("n1", "i1", [], 0) == ([], 8)
    assert ledger.acked("n1", "i1") == 8
    assert ledger.acked("n1", "nope") == 0


def test_out_of_order_number_is_never_double_counted() -> None:
    ledger = Ledger()
    new, acked = ledger.accept("n1", "i1", [5, 3, 6, 6], 0)
    assert (new, acked) == ([0, 2], 6)
    assert ledger.stats()["duplicate_total"] == 2


def test_incarnations_are_independent() -> None:
    ledger = Ledger()
    ledger.accept("n1", "i1", [1, 2, 3], 0)
    # The agent restarted: numbers start at 1 again under a new incarnation.
    assert ledger.accept("n1", "i2", [1, 2], 0) == ([0, 1], 2)
    assert ledger.accept("n2", "i1", [1], 0) == ([0], 1)
    assert ledger.stats()["incarnations"] == 3
    assert ledger.stats()["received_total"] == 6


def test_lost_total_is_the_largest_declared_per_incarnation_summed() -> None:
    ledger = Ledger()
    ledger.accept("n1", "i1", [10], 4)
    ledger.accept("n1", "i1", [11], 7)
    ledger.accept("n1", "i1", [11], 5)  # a stale resend cannot lower it
    ledger.accept("n2", "j1", [1], 2)
    assert ledger.stats()["lost_total"] == 9


def test_memory_is_bounded_and_forgotten_loss_is_kept() -> None:
    ledger = Ledger(max_incarnations_per_agent=2, max_incarnations=5)
    for i in range(10):
        ledger.accept("n1", f"i{i}", [1, 2], 1)
    assert ledger.stats()["incarnations"] == 2
    assert ledger.stats()["lost_total"] == 10
    for n in range(10):
        ledger.accept(f"node{n}", "x", [1], 0)
    assert ledger.stats()["incarnations"] == 5
    # The newest are remembered, the least recently used forgotten.
    assert ledger.acked("node9", "x") == 1
    assert ledger.acked("node0", "x") == 0
    with pytest.raises(ValueError):
        Ledger(max_incarnations=0)


def test_concurrent_streams_take_each_number_once() -> None:
    ledger = Ledger()
    taken: list[int] = []
    lock = threading.Lock()

    def stream(start: int) -> None:
        # Several streams of the same incarnation racing (an old stream still draining after a
        # reconnect): each resends overlapping runs.
        for first in range(start, 2000, 50):
            seqs = list(range(first, first + 100))
            new, _ = ledger.accept("n1", "i1", seqs, 0)
            with lock:
                taken.extend(seqs[i] for i in new)

    threads = [threading.Thread(target=stream, args=(s,)) for s in (1, 1, 26)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == len(set(taken))
    assert ledger.stats()["received_total"] == len(taken)
