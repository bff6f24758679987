"""Job, rank, local rank and physical GPU, per launcher, from the environment each launcher really sets.

torchrun's environment is captured from a real torchrun run (also inside an ``srun`` task's
environment). The others come from the launchers' documentation: Slurm's srun(1) "OUTPUT
ENVIRONMENT VARIABLES", Open MPI's mpirun(1), MPICH/Intel MPI Hydra, the Kubeflow Training
Operator's ``pkg/controller.v1/pytorch/{envvar,master,elastic}.go``, Kubeflow Trainer's torch
plugin, JobSet's pod annotations, the NVIDIA container toolkit and device plugin, ROCm's GPU
isolation variables (docs/IDENTITY.md cites each). ``python -m tests.chopper.identity.test_identity``
prints the table of docs/IDENTITY.md from these environments.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chopper.demo.run import free_port
from chopper.identity import process as _identity
from chopper.identity.device import UNRESOLVED, resolve_device
from chopper.identity.jobname import escape_unprintable, job_name_problem, usable_job_name
from chopper.identity.launcher import resolve_job, resolve_local_rank, resolve_rank, resolve_world_size
from tests.support.strategies import fuzz

SIM = "SIM-1b4e28ba-2fa1-5d3c-8a9f-0c2e1f6f3a11"
GPU_A, GPU_B = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "GPU-5a1c7e02-93b1-4f0e-b6d2-77aa3c9e0f14"

# Each worker writes its environment to a file of its own: two workers printing to one pipe interleave
# their lines under PYTHONUNBUFFERED (one write for the text, one for the newline).
_DUMP = ("import os, json, sys; "
         "open(os.path.join(sys.argv[1], os.environ['RANK'] + '.json'), 'w').write(json.dumps(dict(os.environ)))")


@cache
def torchrun_env(outer: tuple[tuple[str, str], ...] = ()) -> dict[int, dict[str, str]]:
    """Each worker's environment, by RANK, from a real 2-process torchrun with a static rendezvous.

    ``--master-addr/--master-port`` is how multi-node jobs are launched (every node names the
    master); it leaves ``TORCHELASTIC_RUN_ID`` at torchrun's default ``none``. ``outer`` is the
    environment torchrun itself runs in (e.g. an srun task's).
    """
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC", "CUDA_", "CHOPPER"))}
    with tempfile.TemporaryDirectory() as dumps:
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--node-rank", "0", "--nproc-per-node",
             "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--no-python", sys.executable,
             "-c", _DUMP, dumps],
            env={**base, **dict(outer)}, capture_output=True, text=True, timeout=120, check=True)
        envs = [json.loads(f.read_text()) for f in sorted(Path(dumps).glob("*.json"))]
    return {int(e["RANK"]): {k: v for k, v in e.items() if k not in base or k in dict(outer)} for e in envs}


def srun_task(job: int, procid: int, localid: int, ntasks: int, nodeid: int, gpus: str = "") -> dict[str, str]:
    """What srun(1) exports to one task ("OUTPUT ENVIRONMENT VARIABLES"); ``gpus`` as --gpus-per-task binds them."""
    env = {"SLURM_JOB_ID": str(job), "SLURM_JOBID": str(job), "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid),
           "SLURM_LOCALID": str(localid), "SLURM_NODEID": str(nodeid), "SLURM_NTASKS": str(ntasks),
           "SLURM_NPROCS": str(ntasks), "SLURM_NNODES": "2", "SLURM_STEP_NUM_TASKS": str(ntasks),
           "SLURMD_NODENAME": f"gpu{nodeid:03d}", "SLURM_TASKS_PER_NODE": f"{ntasks // 2}(x2)"}
    if gpus:  # Slurm's gpu plugin: CUDA_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL alike, SLURM_STEP_GPUS global ids
        env.update(CUDA_VISIBLE_DEVICES=gpus, GPU_DEVICE_ORDINAL=gpus, SLURM_STEP_GPUS=gpus)
    return env


K8S = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def launchers() -> dict[str, dict[str, str]]:
    """One process's environment per launcher; the expected identity is in EXPECTED."""
    srun_outer = tuple(sorted({**srun_task(4242, 1, 0, 2, 1), "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}.items()))
    return {
        "torchrun (static rendezvous), rank 1": torchrun_env()[1],
        "torchrun, CUDA_VISIBLE_DEVICES=4,5, rank 1": {**torchrun_env()[1], "CUDA_VISIBLE_DEVICES": "4,5"},
        "srun (no torchrun), --gpus-per-task=1, task 3": srun_task(4242, 3, 1, 4, 1, gpus="5"),
        "srun (no torchrun), no GPU binding, task 3": srun_task(4242, 3, 1, 4, 1),
        "srun + torchrun, node 1, worker rank 9": torchrun_env(srun_outer)[1] | {"RANK": "9", "LOCAL_RANK": "1"},
        "sbatch --array=0-9 task 7 (srun)": {**srun_task(4249, 0, 0, 1, 0, gpus="2"), "SLURM_ARRAY_JOB_ID": "4240",
                                              "SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "10"},
        "Open MPI mpirun -np 4, rank 2": {
            "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_UNIVERSE_SIZE": "4",
            "PMIX_RANK": "2", "PMIX_NAMESPACE": "prterun-gpu001-1234@1", "CHOPPER_JOB": "mpi-run"},
        "MPICH / Intel MPI mpiexec (Hydra), rank 3": {
            "PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "7",
            "CHOPPER_JOB": "hydra-run"},
        "PMIx (prterun), rank 5": {"PMIX_RANK": "5", "PMIX_NAMESPACE": "prterun-gpu001-99@1", "CHOPPER_JOB": "pmix"},
        "Kubeflow PyTorchJob worker-1 (1 master + 2 workers)": {
            **K8S, "MASTER_ADDR": "bert-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2",
            "PYTHONUNBUFFERED": "0", "HOSTNAME": "bert-worker-1", "NVIDIA_VISIBLE_DEVICES": GPU_A},
        "Kubeflow PyTorchJob, elastic, torchrun worker 3": {
            **torchrun_env()[1], **K8S, "RANK": "3", "WORLD_SIZE": "4", "PET_RDZV_ENDPOINT": "gpt-worker-0:23456",
            "PET_RDZV_BACKEND": "c10d", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2",
            "NVIDIA_VISIBLE_DEVICES": f"{GPU_A},{GPU_B}"},
        "Kubeflow Trainer TrainJob node 1, torchrun worker 9": {
            **torchrun_env()[1], **K8S, "RANK": "9", "WORLD_SIZE": "16", "PET_MASTER_ADDR": "llama-node-0-0.llama",
            "PET_MASTER_PORT": "29500", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "8", "PET_NODE_RANK": "1",
            "JOB_COMPLETION_INDEX": "1", "NVIDIA_VISIBLE_DEVICES": "void"},
        "JobSet (JOBSET_NAME by the downward API), torchrun rank 1": {
            **torchrun_env()[1], **K8S, "JOBSET_NAME": "js-train", "JOB_COMPLETION_INDEX": "0",
            "NVIDIA_VISIBLE_DEVICES": f"{GPU_A},{GPU_B}"},
        "ROCm: ROCR_VISIBLE_DEVICES=2,3 HIP_VISIBLE_DEVICES=1": {
            "ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1", "RANK": "0", "CHOPPER_JOB": "rocm"},
        "ROCm under Slurm (ROCR, GPU_DEVICE_ORDINAL, CUDA alike), task 1": {
            **srun_task(4242, 1, 1, 2, 0, gpus="4,5"), "ROCR_VISIBLE_DEVICES": "4,5"},
        "simulated node, CUDA_VISIBLE_DEVICES=SIM-…": {"CUDA_VISIBLE_DEVICES": SIM, "RANK": "0", "CHOPPER_JOB": "sim"},
    }


# (job, rank, local rank, physical GPU): the GPU as an agent index, or the UUID the agent maps.
EXPECTED: dict[str, tuple[str, int, int | None, int | str]] = {
    "torchrun (static rendezvous), rank 1": ("default", 1, 1, 1),
    "torchrun, CUDA_VISIBLE_DEVICES=4,5, rank 1": ("default", 1, 1, 5),
    "srun (no torchrun), --gpus-per-task=1, task 3": ("4242", 3, 1, 5),
    "srun (no torchrun), no GPU binding, task 3": ("4242", 3, 1, 1),
    "srun + torchrun, node 1, worker rank 9": ("4242", 9, 1, 1),
    "sbatch --array=0-9 task 7 (srun)": ("4240_7", 0, 0, 2),
    "Open MPI mpirun -np 4, rank 2": ("mpi-run", 2, 0, 0),
    "MPICH / Intel MPI mpiexec (Hydra), rank 3": ("hydra-run", 3, 1, 1),
    "PMIx (prterun), rank 5": ("pmix", 5, None, -1),
    "Kubeflow PyTorchJob worker-1 (1 master + 2 workers)": ("bert", 2, None, GPU_A),
    "Kubeflow PyTorchJob, elastic, torchrun worker 3": ("gpt", 3, 1, GPU_B),
    "Kubeflow Trainer TrainJob node 1, torchrun worker 9": ("llama", 9, 1, UNRESOLVED),
    "JobSet (JOBSET_NAME by the downward API), torchrun rank 1": ("js-train", 1, 1, GPU_B),
    "ROCm: ROCR_VISIBLE_DEVICES=2,3 HIP_VISIBLE_DEVICES=1": ("rocm", 0, None, 3),
    "ROCm under Slurm (ROCR, GPU_DEVICE_ORDINAL, CUDA alike), task 1": ("4242", 1, 1, 5),
    "simulated node, CUDA_VISIBLE_DEVICES=SIM-…": ("sim", 0, None, SIM),
}


def resolved(env: Mapping[str, str], modules: Mapping[str, Any] | None = None) -> tuple[Any, ...]:
    modules = {} if modules is None else modules
    local = resolve_local_rank(env)
    device = resolve_device(env, local.value, modules, local.source)
    gpu: int | str = device.gpu if device.gpu >= 0 or not device.uuid else device.uuid
    if isinstance(gpu, str) and gpu.startswith(UNRESOLVED):
        gpu = UNRESOLVED
    return resolve_job(env).value, resolve_rank(env, modules).value, local.value, gpu


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(EXPECTED))
def test_each_launcher_resolves_to_its_job_rank_and_physical_gpu(launcher: str) -> None:
    assert resolved(launchers()[launcher]) == EXPECTED[launcher]


def test_torchruns_own_environment_is_what_the_rules_assume() -> None:
    """The captured variables, not a copy of them: a torchrun that changed them would fail here."""
    env = torchrun_env()[1]
    assert env["TORCHELASTIC_RUN_ID"] == "none"  # the default that must not name the job
    assert {env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {"1", "2"}
    assert resolve_world_size(env, {}).value == 2


def test_srun_torchrun_nesting_takes_the_workers_rank_without_warning() -> None:
    env = launchers()["srun + torchrun, node 1, worker rank 9"]
    assert env["SLURM_PROCID"] == "1" and env["SLURM_LOCALID"] == "0"  # torchrun's own srun task
    for r in (resolve_rank(env, {}), resolve_local_rank(env), resolve_world_size(env, {})):
        assert not r.warnings and r.source in ("RANK", "LOCAL_RANK", "WORLD_SIZE")


def test_initialised_torch_distributed_is_the_rank() -> None:
    dist = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda: 11,
                           get_world_size=lambda: 16)
    env = {"RANK": "11", "WORLD_SIZE": "16"}
    assert resolve_rank(env, {"torch.distributed": dist}).source == "torch.distributed"
    assert resolve_world_size(env, {"torch.distributed": dist}).value == 16
    half = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: 1 / 0)
    assert resolve_rank(env, {"torch.distributed": half}).value == 11  # a broken process group is skipped


def _cuda(ordinal: int, uuid: str, hip: str | None = None) -> dict[str, Any]:
    """``sys.modules`` with a torch whose CUDA is initialised on ``ordinal`` (torch's own API, without a GPU)."""
    props = SimpleNamespace(uuid=uuid)
    cuda = SimpleNamespace(is_initialized=lambda: True, current_device=lambda: ordinal,
                           get_device_properties=lambda i: props)
    return {"torch": SimpleNamespace(cuda=cuda, version=SimpleNamespace(hip=hip))}


def test_torchs_device_uuid_names_the_gpu_over_the_environment() -> None:
    # A container whose devices came through CDI: the environment cannot tell, torch's UUID can.
    env = {"NVIDIA_VISIBLE_DEVICES": "void", "LOCAL_RANK": "1"}
    assert resolve_device(env, 1, {}).uuid.startswith(UNRESOLVED)
    device = resolve_device(env, 1, _cuda(1, GPU_B.removeprefix("GPU-")))
    assert (device.gpu, device.uuid, device.warnings) == (-1, GPU_B, ())
    # An index from the environment travels with the UUID; the agent's UUID mapping wins over it.
    device = resolve_device({"CUDA_VISIBLE_DEVICES": "4,5"}, 1, _cuda(1, GPU_A.removeprefix("GPU-")))
    assert (device.gpu, device.uuid) == (5, GPU_A)
    # A UUID in the environment that is not torch's device: said, torch's used.
    device = resolve_device({"CUDA_VISIBLE_DEVICES": f"{GPU_A},{GPU_B}"}, 0, _cuda(0, GPU_B.removeprefix("GPU-")))
    assert device.uuid == GPU_B and f"names {GPU_A} for this rank, but torch's current device is {GPU_B}" in (
        device.warnings[0])
    # ROCm's device UUID is not amdsmi's: only the ordinal is taken.
    assert resolve_device({"ROCR_VISIBLE_DEVICES": "6,7"}, 0, _cuda(1, "x", hip="6.2")).gpu == 7


def test_visibility_idioms_for_no_gpu_and_all_gpus() -> None:
    for hidden in ("", "-1", "NoDevFiles"):
        device = resolve_device({"CUDA_VISIBLE_DEVICES": hidden, "LOCAL_RANK": "0"}, 0, {})
        assert (device.gpu, device.uuid, device.warnings) == (-1, "", ())
    assert resolve_device({"NVIDIA_VISIBLE_DEVICES": "none"}, 0, {}).gpu == -1
    assert resolve_device({"NVIDIA_VISIBLE_DEVICES": "all"}, 3, {}).gpu == 3
    assert resolve_device({"NVIDIA_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "1"}, 0, {}).gpu == 3
    assert resolve_device({}, None, {}).gpu == -1  # a bare python process drives no GPU
    assert resolve_device({"CHOPPER_GPU": "6", "CUDA_VISIBLE_DEVICES": "1"}, 0, {}).gpu == 6


# -- bad input: each a warning naming the variable and the fix; never an exception


def test_disagreeing_launcher_variables_give_one_warning_naming_both() -> None:
    r = resolve_rank({"RANK": "1", "SLURM_PROCID": "0"}, {})
    assert r.value == 1 and len(r.warnings) == 1
    assert "RANK=1 disagrees with SLURM_PROCID=0; using RANK because RANK is what torch.distributed's env:// " \
           "initialisation reads" in r.warnings[0]
    assert "unset it or launch with torchrun" in r.warnings[0]
    assert not resolve_rank({"RANK": "2", "SLURM_PROCID": "2", "OMPI_COMM_WORLD_RANK": "2"}, {}).warnings


def test_a_malformed_value_is_named_and_the_next_source_used() -> None:
    r = resolve_rank({"RANK": "oops", "SLURM_PROCID": "3"}, {})
    assert r.value == 3 and r.source == "SLURM_PROCID"
    assert r.warnings == ("RANK='oops' is not an integer from 0 to 2147483647; ignored, the next source is used",)
    assert resolve_local_rank({"LOCAL_RANK": "-2"}).value is None
    job = resolve_job({"SLURM_JOB_ID": "12x", "TORCHELASTIC_RUN_ID": "abc"})
    assert job.value == "abc" and "SLURM_JOB_ID='12x' is not a Slurm job id" in job.warnings[0]


def test_the_default_job_says_how_to_name_it() -> None:
    job = resolve_job({"TORCHELASTIC_RUN_ID": "none"})
    assert job.value == "default"
    assert "torchrun's run id is 'none'" in job.warnings[0] and "set CHOPPER_JOB" in job.warnings[0]
    # Operators' host names outside a pod are not job names.
    assert resolve_job({"MASTER_ADDR": "bert-master-0"}).value == "default"


def test_a_visible_device_entry_naming_no_device_is_unresolved_never_another_gpu() -> None:
    device = resolve_device({"CUDA_VISIBLE_DEVICES": "4,5"}, 3, {})
    assert device.gpu == -1 and device.uuid.startswith(UNRESOLVED)
    assert "ordinal 3 (LOCAL_RANK=3) is beyond the 2 devices of CUDA_VISIBLE_DEVICES='4,5'" in device.uuid
    assert "flagged unknown_device" in device.warnings[0] and "set CHOPPER_GPU" in device.warnings[0]
    garbled = resolve_device({"CUDA_VISIBLE_DEVICES": "4,x,5"}, 1, {})
    assert garbled.gpu == 4  # CUDA sees only the entries before 'x': one device, whatever the local rank
    assert "CUDA_VISIBLE_DEVICES='4,x,5': entry 'x' is neither a device index nor a UUID" in garbled.warnings[0]
    beyond = resolve_device({"NVIDIA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "3"}, 0, {})
    assert "CUDA_VISIBLE_DEVICES entry 3 is beyond the 2 devices of NVIDIA_VISIBLE_DEVICES='0,1'" in beyond.uuid


def test_init_logs_each_problem_once_and_never_raises(caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_identity, "_warned", set())
    env = {"RANK": "1", "SLURM_PROCID": "0", "CUDA_VISIBLE_DEVICES": "4,5", "LOCAL_RANK": "3"}
    with caplog.at_level(logging.INFO, logger="chopper.client"):
        first = _identity.resolve(env, {})
        again = _identity.resolve(env, {})
    assert first == again and (first.job, first.rank, first.gpu) == ("default", 1, -1)
    problems = [r.getMessage() for r in caplog.records if "event=identity_problem" in r.getMessage()]
    assert len(problems) == 3, problems  # default job, RANK vs SLURM_PROCID, the unresolved device: once each
    assert sum("event=identity " in r.getMessage() for r in caplog.records) == 2
    broken = _identity.resolve({"CUDA_VISIBLE_DEVICES": "0"}, {"torch": object()}, job="j", rank=2)
    assert (broken.job, broken.rank, broken.gpu) == ("j", 2, 0)  # a torch without .cuda is ignored


def table() -> str:
    """The launcher table of docs/IDENTITY.md, resolved by the code from the environments above."""
    rows = ["| launcher (environment) | job | rank | local rank | physical GPU |", "|---|---|---|---|---|"]
    for name, env in launchers().items():
        job, rank, local, gpu = resolved(env)
        gpu_text = f"`{gpu}` (the agent maps it)" if isinstance(gpu, str) and gpu != UNRESOLVED else \
            "unresolved: flagged `unknown_device` (torch's UUID resolves it)" if gpu == UNRESOLVED else \
            "none" if gpu == -1 else str(gpu)
        rows.append(f"| {name} | `{job}` | {rank} | {'–' if local is None else local} | {gpu_text} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())


def test_a_rank_beyond_what_the_wire_holds_is_named_and_the_next_source_used() -> None:
    r = resolve_rank({"RANK": str(2**31), "SLURM_PROCID": "5"}, {})
    assert (r.value, r.source) == (5, "SLURM_PROCID")
    assert r.warnings == ("RANK='2147483648' is not an integer from 0 to 2147483647; ignored, the next source is used",)
    assert resolve_world_size({"WORLD_SIZE": "9" * 5000}, {}).value == 1  # beyond int()'s digit limit too


# Text in the shapes a launcher or a clumsy user produces: raw bytes (surrogate escapes), control
# characters, long runs of characters that URI-encode to 1, 3 or 9 characters.
_wild_text = st.text(st.one_of(st.characters(), st.sampled_from(["\udcff", "\udc80", "\n", "\x00", "/", "中", "a"])),
                     max_size=600)


@fuzz(300, timeout_s=60)
@given(_wild_text)
def test_any_text_becomes_a_job_name_the_agent_and_store_accept(text: str) -> None:
    used = usable_job_name(text)
    assert job_name_problem(used) is None
    used.encode("utf-8")  # raises for what no protobuf string field holds
    assert usable_job_name(used) == used
    if job_name_problem(text) is None:
        assert used == text


@fuzz(300, timeout_s=60)
@given(_wild_text)
def test_escaping_makes_any_text_printable_and_keeps_bytes_apart(text: str) -> None:
    escaped = escape_unprintable(text)
    assert escaped.isprintable()
    escaped.encode("utf-8")  # raises for what no protobuf string field holds
    if text.isprintable():
        assert escaped == text
    assert escape_unprintable(text + "\udcfe") != escape_unprintable(text + "\udcff")


def test_long_job_names_that_share_a_prefix_stay_apart() -> None:
    a, b = usable_job_name("x" * 300 + "a"), usable_job_name("x" * 300 + "b")
    assert a != b and a.startswith("x" * 200) and job_name_problem(a) is job_name_problem(b) is None
    assert usable_job_name("") == "default"
