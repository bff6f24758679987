"""deploy/slurm/chopper-jobmap.sh run as slurmd runs it (plain sh, a bare environment), read back by the agent."""
from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from agent.jobmap import read_job_map

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "chopper-jobmap.sh"


def run(mapdir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The script under /bin/sh with only what slurmd would set (no PATH: the script sets its own)."""
    return subprocess.run(
        ["/bin/sh", str(SCRIPT), *args], env={"CHOPPER_JOB_MAPPING_DIR": str(mapdir), **env},
        capture_output=True, text=True, timeout=30,
    )


def prolog(mapdir: Path, job: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run(mapdir, SLURM_SCRIPT_CONTEXT="prolog_slurmd", SLURM_JOB_ID=job, **env)


def epilog(mapdir: Path, job: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run(mapdir, SLURM_SCRIPT_CONTEXT="epilog_slurmd", SLURM_JOB_ID=job, **env)


def test_prolog_maps_the_jobs_gpus_and_epilog_frees_them(tmp_path: Path) -> None:
    mapdir = tmp_path / "jobmap"
    assert prolog(mapdir, "4242", SLURM_JOB_GPUS="0,2").returncode == 0
    assert prolog(mapdir, "4243", CUDA_VISIBLE_DEVICES="2,3").returncode == 0  # shares GPU 2 (shard gres)
    assert read_job_map(mapdir).jobs == {0: ("4242",), 2: ("4242", "4243"), 3: ("4243",)}
    assert oct(os.stat(mapdir / "2").st_mode & 0o777) == "0o644"  # readable by an agent that is not root
    assert epilog(mapdir, "4242", SLURM_JOB_GPUS="0,2").returncode == 0
    assert read_job_map(mapdir).jobs == {2: ("4243",), 3: ("4243",)}
    assert epilog(mapdir, "4243", CUDA_VISIBLE_DEVICES="2,3").returncode == 0
    assert sorted(p.name for p in mapdir.iterdir()) == []  # no files, no temporaries, no lock left


def test_amd_variables_and_manual_use(tmp_path: Path) -> None:
    assert run(tmp_path, "add", SLURM_JOB_ID="7", ROCR_VISIBLE_DEVICES="5").returncode == 0
    assert run(tmp_path, "add", SLURM_JOBID="8", GPU_DEVICE_ORDINAL="6").returncode == 0
    assert read_job_map(tmp_path).jobs == {5: ("7",), 6: ("8",)}
    assert run(tmp_path, "remove", SLURM_JOB_ID="7", ROCR_VISIBLE_DEVICES="5").returncode == 0
    assert read_job_map(tmp_path).jobs == {6: ("8",)}


@pytest.mark.parametrize(
    ("env", "message", "mapped"),
    [
        ({"SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_GPUS": "0"}, "SLURM_JOB_ID '' is empty or not a job id",
         {}),
        ({"SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_ID": "1;rm", "SLURM_JOB_GPUS": "0"}, "not a job id", {}),
        ({"SLURM_SCRIPT_CONTEXT": "prolog_slurmctld", "SLURM_JOB_ID": "1"}, "nothing to do for context", {}),
        ({"SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "GPU-1a2b,1"},
         "GPU 'GPU-1a2b' in 'GPU-1a2b,1' is not a GPU index; skipped", {1: ("1",)}),
    ],
)
def test_bad_input_is_logged_and_never_fails_the_job(
    tmp_path: Path, env: dict[str, str], message: str, mapped: dict[int, tuple[str, ...]]
) -> None:
    result = run(tmp_path, **env)
    assert result.returncode == 0  # a failing prolog would drain the node
    assert message in result.stderr
    assert read_job_map(tmp_path).jobs == mapped


def test_an_unwritable_directory_is_logged_and_still_exits_0(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = prolog(blocker / "jobmap", "9", SLURM_JOB_GPUS="0")
    assert result.returncode == 0 and "cannot create" in result.stderr


def test_jobs_starting_together_on_a_shared_gpu_are_all_kept(tmp_path: Path) -> None:
    jobs = [str(1000 + i) for i in range(8)]
    threads = [threading.Thread(target=prolog, args=(tmp_path, job), kwargs={"SLURM_JOB_GPUS": "1"}) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(read_job_map(tmp_path).jobs[1]) == jobs  # the lock serialised the read-modify-write


def test_a_stale_lock_is_taken_over_after_the_wait(tmp_path: Path) -> None:
    (tmp_path / ".lock").mkdir()  # left by a prolog that was killed
    result = prolog(tmp_path, "5", SLURM_JOB_GPUS="0", CHOPPER_JOBMAP_LOCK_WAIT_S="1")
    assert result.returncode == 0 and "taking it over" in result.stderr
    assert read_job_map(tmp_path).jobs == {0: ("5",)}
