"""The Slurm job mapping directory as the agent reads it: good files, bad files, a missing directory."""
from __future__ import annotations

from pathlib import Path

import pytest

from agent.jobmap import MAX_FILE_BYTES, JobMapUnreadable, parse_job_file, read_job_map
from agent.workload import JobMapSource, Workload, WorkloadTracker


def test_one_file_per_gpu_index_with_one_job_per_line(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("4242\n")
    (tmp_path / "3").write_text("# shared GPU\n4243\n\n4244_7\n4243\n")
    (tmp_path / ".3.12345").write_text("half-written by the prolog\n")  # its temporary file
    (tmp_path / ".lock").mkdir()
    reading = read_job_map(tmp_path)
    assert reading.jobs == {0: ("4242",), 3: ("4243", "4244_7")}
    assert reading.problems == ()


def test_a_bad_file_is_reported_and_the_others_still_count(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("4242\n")
    (tmp_path / "1").write_text("job with spaces\n")
    (tmp_path / "2").write_bytes(b"\xff\xfe")
    (tmp_path / "4").write_text("1" * (MAX_FILE_BYTES + 1))
    (tmp_path / "5").mkdir()
    (tmp_path / "6").write_text("")  # emptied: no owner
    reading = read_job_map(tmp_path)
    assert reading.jobs == {0: ("4242",)}
    problems = "\n".join(reading.problems)
    assert f"{tmp_path / '1'}: line 1 'job with spaces' is not a job id" in problems
    assert f"{tmp_path / '2'}: is not ASCII text" in problems
    assert f"{tmp_path / '4'}: is larger than" in problems
    assert f"{tmp_path / '5'}: is a directory" in problems
    assert len(reading.problems) == 4


def test_a_missing_directory_names_itself_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(JobMapUnreadable, match=r"job_mapping_dir '.*/absent' does not exist; create it"):
        read_job_map(tmp_path / "absent")


def test_job_ids_are_bounded_printable_tokens() -> None:
    assert parse_job_file("  77  \n") == ("77",)
    with pytest.raises(ValueError, match="line 2"):
        parse_job_file("77\n" + "x" * 129 + "\n")


def test_tracker_reports_the_directory_down_until_it_appears_and_counts_bad_files(tmp_path: Path) -> None:
    source = JobMapSource(tmp_path / "jobmap")
    tracker = WorkloadTracker([source], refresh_s=1)
    tracker.refresh()
    assert not source.health.up and source.health.errors == {"unreadable": 1} and tracker.table() == {}
    (tmp_path / "jobmap").mkdir()
    (tmp_path / "jobmap" / "1").write_text("4242\n4243\n")
    (tmp_path / "jobmap" / "2").write_text("bad id\n")
    tracker.refresh()
    assert source.health.up and source.health.errors == {"unreadable": 1, "bad_file": 1}
    assert tracker.table() == {1: (Workload("jobmap", job="4242"), Workload("jobmap", job="4243"))}
    assert tracker.jobs() == {1: "4242,4243"}  # what samples of GPU 1 carry
    tracker.refresh()  # still bad: counted when it turned up, not on every refresh
    assert source.health.errors["bad_file"] == 1
    (tmp_path / "jobmap" / "2").write_text("4244\n")
    tracker.refresh()
    (tmp_path / "jobmap" / "2").write_text("bad again\n")
    tracker.refresh()
    assert source.health.errors["bad_file"] == 2
