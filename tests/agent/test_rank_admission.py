"""Room for a new (job, rank) at max_ranks: finished ranks go, live ranks inside a step stay, the rest is refused."""
from __future__ import annotations

from agent.daemon import SUMMARY_INTERVAL_NS
from tests.support.markers import BEGIN, END
from tests.support.simulated_node import SimulatedNode


def test_ranks_inside_a_step_are_kept_and_the_new_rank_is_refused_and_counted() -> None:
    node = SimulatedNode("--max-ranks", "2", "--rank-idle-s", "60")
    node.send("train", 0, (BEGIN, 0))
    node.send("train", 1, (BEGIN, 0))
    node.at(1)
    node.send("made-up", 7, (BEGIN, 0), (BEGIN, 1))
    assert node.tracked() == {("train", 0), ("train", 1)}
    assert node.agent.rejected == {"too_many_ranks": 2} and node.agent.ranks_retired["limit"] == 0
    node.at(2)
    node.send("train", 0, (END, 0))  # the live ranks lost nothing: their steps still close
    assert node.agent.rejected.total() == 2


def test_a_rank_silent_inside_a_step_for_rank_idle_s_makes_room() -> None:
    node = SimulatedNode("--max-ranks", "2", "--rank-idle-s", "60")
    node.send("dead", 0, (BEGIN, 0))  # a trainer that died inside a step
    node.send("live", 0, (BEGIN, 0))
    node.at(59)
    node.send("live", 0, (END, 0), (BEGIN, 1))
    node.send("new", 0, (BEGIN, 0))
    assert node.agent.rejected["too_many_ranks"] == 1  # dead has been silent 59 s: not yet
    node.at(61)
    node.send("new", 0, (BEGIN, 0))
    assert node.tracked() == {("live", 0), ("new", 0)} and node.agent.ranks_retired["limit"] == 1


def test_a_rank_waiting_for_its_summary_makes_room_after_those_that_are_not_and_its_summary_still_comes() -> None:
    node = SimulatedNode("--max-ranks", "2")
    node.send("waiting", 0, (BEGIN, 0), (END, 0))
    node.send("summarised", 0, (BEGIN, 0), (END, 0))
    node.at(1)
    node.agent.tick(node.now)
    assert node.agent.summaries_total == 2
    node.at(1.05)
    # Its step ends at 3 s on its clock: no sample covers it until then.
    node.send("waiting", 0, (BEGIN, 1), (END, 1), stamped_s=3)
    node.at(1.1)
    node.send("summarised", 0, (BEGIN, 1), (END, 1))
    node.at(1.1 + SUMMARY_INTERVAL_NS / 1e9)  # the summaries' next turn
    node.agent.tick(node.now)
    assert node.agent.summaries_total == 3
    node.send("new", 0, (BEGIN, 0))
    assert node.tracked() == {("waiting", 0), ("new", 0)}, "silent longest, but its summary is pending"
    node.send("newer", 0, (BEGIN, 0))
    assert node.tracked() == {("new", 0), ("newer", 0)}
    assert node.agent.rejected.total() == 0 and node.agent.ranks_retired["limit"] == 2
    node.at(3.5)
    node.agent.tick(node.now)
    # The forgotten rank's last step is summarised and sent on, but makes it no series again.
    assert [(s.job, s.step) for s in node.agent.summaries.read(0, 10)[0]][3:] == [("waiting", 1)]
    assert ("waiting", 0) not in node.agent.rank_figures_now()
