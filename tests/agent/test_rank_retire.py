"""Retirement of silent ranks keeps what is still in flight: open steps, pending summaries, live siblings."""
from __future__ import annotations

from agent.daemon import SUMMARY_INTERVAL_NS
from tests.support.markers import BEGIN, END
from tests.support.simulated_node import SimulatedNode


def test_an_open_step_outlives_the_silence_and_still_closes() -> None:
    node = SimulatedNode("--rank-idle-s", "10")
    node.send("j", 0, (BEGIN, 0))
    node.at(60)  # a step of a minute without a marker: a checkpoint save, say
    node.agent.tick(node.now)
    assert node.tracked() == {("j", 0)} and node.agent.ranks_retired["idle"] == 0
    node.send("j", 0, (END, 0))
    node.at(60.1 + SUMMARY_INTERVAL_NS / 1e9)  # the summaries' next turn after the last
    node.agent.tick(node.now)
    assert node.agent.rejected.total() == 0
    assert [s.step_time_s for s in node.agent.summaries.read(0, 100)[0]] == [60.0]


def test_pending_summaries_are_made_before_the_rank_goes() -> None:
    node = SimulatedNode("--rank-idle-s", "10")
    node.send("j", 0, (BEGIN, 0))
    node.at(1)
    node.send("j", 0, (END, 0))
    node.at(30)
    assert node.agent.retire_idle(node.now) == 0  # its step waits for a sample that covers it
    node.agent.tick(node.now)  # summarises, then retires
    assert node.tracked() == set() and node.agent.ranks_retired["idle"] == 1
    assert len(node.agent.summaries.read(0, 100)[0]) == 1 and node.agent.summaries_total == 1
    assert node.agent.rank_figures_now() == {}


def test_a_rank_goes_only_when_its_whole_job_is_silent() -> None:
    node = SimulatedNode("--rank-idle-s", "10")
    for rank in (0, 1):
        node.send("j", rank, (BEGIN, 0), (END, 0))
    node.send("k", 0, (BEGIN, 0), (END, 0))
    node.at(8)
    node.send("j", 1, (BEGIN, 1), (END, 1))
    node.at(12)
    node.agent.tick(node.now)
    # Rank 0 of j has been silent 12 s, but its job has not; k has.
    assert node.tracked() == {("j", 0), ("j", 1)}
    node.at(19)
    node.agent.tick(node.now)
    assert node.tracked() == set() and node.agent.ranks_retired["idle"] == 3


def test_the_limit_evicts_ranks_without_an_open_step_first() -> None:
    node = SimulatedNode("--max-ranks", "2")
    node.send("old", 0, (BEGIN, 0))  # in a step
    node.at(1)
    node.send("mid", 0, (BEGIN, 0), (END, 0))
    node.agent.tick(node.now)
    node.at(2)
    node.send("new", 0, (BEGIN, 0))
    assert node.tracked() == {("old", 0), ("new", 0)} and node.agent.ranks_retired["limit"] == 1
