"""The one-line summary of where a job's ranks are."""
from __future__ import annotations

from chopper.positions import MAX_GROUPS, describe, rank_ranges
from chopper.proto.chopper.v1 import agent_pb2 as pb

NS = 1_000_000_000
NOW = 1_700_000_000 * NS


def _at(rank: int, *, phase: str = "", collective: str = "", since_s: float = 120.0, step: int = 1234,
        between: bool = False) -> pb.RankPosition:
    begin = NOW - int(since_s * NS)
    if between:
        return pb.RankPosition(rank=rank, step=-1, last_step=step, last_marker_ns=begin, as_of_ns=NOW)
    return pb.RankPosition(rank=rank, step=step, step_begin_ns=begin - NS, phase=phase,
                           phase_begin_ns=begin if phase else 0, collective=collective,
                           collective_begin_ns=begin if collective else 0, as_of_ns=NOW)


def test_the_issue_example() -> None:
    positions = [_at(r, phase="backward", collective="all_reduce") for r in range(7)]
    positions.append(_at(7, phase="backward", since_s=121.2))
    assert describe(positions) == ("ranks 0-6 inside collective all_reduce of step 1234 for 120 s; "
                                   "rank 7 inside phase backward of step 1234 for 121 s")


def test_durations_differ_steps_and_between_steps() -> None:
    positions = [_at(0, collective="all_gather", since_s=3.0), _at(1, collective="all_gather", since_s=5.4),
                 _at(2, since_s=9), _at(3, between=True, since_s=60, step=1233)]
    assert describe(positions) == ("ranks 0-1 inside collective all_gather of step 1234 for 3-5 s; "
                                   "rank 2 inside step 1234 for 10 s; rank 3 between steps after step 1233 for 60 s")
    assert describe([_at(0, between=True, step=-1)]) == "rank 0 between steps before its first step for 120 s"
    assert describe([]) == ""


def test_bounded_whatever_the_number_of_places() -> None:
    positions = [_at(r, phase=f"p{r}") for r in range(MAX_GROUPS + 5)]
    line = describe(positions)
    assert line.count(";") == MAX_GROUPS and line.endswith("; 5 more ranks elsewhere")


def test_rank_ranges() -> None:
    assert rank_ranges([10, 0, 1, 2, 3, 7, 9, 3]) == "0-3,7,9-10"
    assert rank_ranges([]) == ""


def test_a_stall_is_said_once_it_lasts_and_again_every_period() -> None:
    from chopper.positions import StallNotice

    now = [0.0]
    notice = StallNotice(after_s=10.0, clock=lambda: now[0])
    hung = [pb.RankPosition(job="j", rank=0, step=5, collective="all_reduce", collective_begin_ns=NOW - 12 * NS,
                            as_of_ns=NOW),
            pb.RankPosition(job="j", rank=1, step=5, phase="backward", phase_begin_ns=NOW - 13 * NS, as_of_ns=NOW)]
    idle = [pb.RankPosition(job="k", rank=0, step=-1, last_step=9, last_marker_ns=NOW, as_of_ns=NOW)]
    notice.stepped("j")
    assert notice.lines(hung + idle) == []
    now[0] = 9.0
    assert notice.lines(hung + idle) == []
    now[0] = 12.0
    assert notice.lines(hung + idle) == [
        "job j: no step for 12 s; rank 0 inside collective all_reduce of step 5 for 12 s; "
        "rank 1 inside phase backward of step 5 for 13 s"]  # job k has no rank inside a step: not stalled
    now[0] = 15.0
    assert notice.lines(hung) == []
    now[0] = 22.5
    assert len(notice.lines(hung)) == 1
    notice.stepped("j")  # it moves again
    now[0] = 30.0
    assert notice.lines(hung) == []
