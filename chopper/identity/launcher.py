"""Who a training process is to its launcher: job, rank, local rank and world size.

Pure functions of an environment mapping (and, for torch.distributed, of ``sys.modules``): no
I/O, no logging. Each returns the value and the warnings to log, so ``chopper.identity.process`` logs
them once at ``chopper.init`` and tests read them directly. Nothing here raises on bad input.

Job, first that gives a value (docs/IDENTITY.md):

1. ``CHOPPER_JOB``.
2. Slurm: ``SLURM_ARRAY_JOB_ID`` + ``_`` + ``SLURM_ARRAY_TASK_ID`` for an array task (the name
   ``squeue`` shows), else ``SLURM_JOB_ID``. Both must be decimal integers.
3. ``TORCHELASTIC_RUN_ID`` unless it is ``none``: torchrun's default ``--rdzv-id`` whenever the
   rendezvous is static (``--master-addr``/``--master-port``, every multi-node static launch),
   which would merge every such job of a cluster into one.
4. Kubernetes, where ``KUBERNETES_SERVICE_HOST`` shows the process runs in a pod:
   ``JOBSET_NAME`` (the JobSet name, exposed through the downward API from the pod annotation
   ``jobset.sigs.k8s.io/jobset-name`` as JobSet's users conventionally do); the TrainJob name
   in Kubeflow Trainer's ``PET_MASTER_ADDR`` (``<name>-node-0-0.<name>``); the PyTorchJob name
   in Kubeflow Training Operator's ``MASTER_ADDR`` (``<name>-master-0``) or, for an elastic
   PyTorchJob, ``PET_RDZV_ENDPOINT`` (``<name>-worker-0:<port>``).
5. ``default``, with a warning saying how to name the job.

Rank, local rank and world size, each from its own first source that holds a non-negative
integer: ``torch.distributed`` when the process group is initialised (rank and world size
only), then ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` (torchrun and most wrappers; what
``init_process_group("env://")`` reads), then Slurm (``SLURM_PROCID``/``SLURM_LOCALID``/
``SLURM_NTASKS``), Open MPI (``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_LOCAL_RANK``/
``OMPI_COMM_WORLD_SIZE``), MPICH and Intel MPI's Hydra (``PMI_RANK``/``MPI_LOCALRANKID``/
``PMI_SIZE``) and PMIx (``PMIX_RANK``). Defaults: rank 0, world size 1, local rank unknown.

A malformed value (not an integer from 0 to ``MAX_INDEX``, what the wire's int32 holds) is warned
about, naming the variable, and the next source is used. Two sources that disagree give one
warning naming both and the one used.
Under torchrun (``TORCHELASTIC_RUN_ID`` is set) the Slurm and MPI variables describe the
launcher's own task, one per node, not the worker: they are expected to differ and are ignored.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_JOB = "default"
# Ranks, local ranks and world sizes travel as int32 (chopper.v1.MarkerBatch.rank).
MAX_INDEX = 2**31 - 1

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# Variables a launcher sets for the process it starts; under torchrun they belong to torchrun itself.
_OUTER_LAUNCHER_VARS = frozenset(RANK_VARS[1:] + LOCAL_RANK_VARS[1:] + WORLD_SIZE_VARS[1:])
_TORCHRUN_VARS = frozenset(("RANK", "LOCAL_RANK", "WORLD_SIZE"))

# A Kubernetes object name as operators embed it in host names (an RFC 1123 label).
_K8S_NAME = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_TRAINJOB_MASTER = re.compile(rf"(?P<name>{_K8S_NAME})-node-0-0\.(?P=name)(?:\..*)?")
_PYTORCHJOB_MASTER = re.compile(rf"(?P<name>{_K8S_NAME})-master-0")
_PYTORCHJOB_RDZV = re.compile(rf"(?P<name>{_K8S_NAME})-worker-0:\d+")


@dataclass(frozen=True, slots=True)
class Resolved:
    """One resolved value, where it came from (``source``, e.g. ``"SLURM_PROCID"``) and what to warn about."""

    value: Any
    source: str
    warnings: tuple[str, ...] = ()


def _get(env: Mapping[str, str], key: str) -> str:
    return env.get(key, "").strip()


def resolve_job(env: Mapping[str, str]) -> Resolved:
    """The job id, from the sources in the module docstring's order."""
    warnings: list[str] = []
    value = _get(env, "CHOPPER_JOB")
    if value:
        return Resolved(value, "CHOPPER_JOB")
    slurm = _slurm_job(env, warnings)
    if slurm is not None:
        return Resolved(slurm[0], slurm[1], tuple(warnings))
    run_id = _get(env, "TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return Resolved(run_id, "TORCHELASTIC_RUN_ID", tuple(warnings))
    k8s = _kubernetes_job(env)
    if k8s is not None:
        return Resolved(k8s[0], k8s[1], tuple(warnings))
    why = ("torchrun's run id is 'none' (its default under a static rendezvous) and no scheduler names the job"
           if run_id == "none" else "no launcher or scheduler names the job")
    warnings.append(f"job name is {DEFAULT_JOB!r}: {why}, so every such job on this node is merged into one; "
                    "set CHOPPER_JOB (or torchrun --rdzv-id, or pass chopper.init(job=...))")
    return Resolved(DEFAULT_JOB, "default", tuple(warnings))


def _slurm_job(env: Mapping[str, str], warnings: list[str]) -> tuple[str, str] | None:
    array_job, array_task = _get(env, "SLURM_ARRAY_JOB_ID"), _get(env, "SLURM_ARRAY_TASK_ID")
    if array_job or array_task:
        if array_job.isdecimal() and array_task.isdecimal():
            return f"{array_job}_{array_task}", "SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID"
        warnings.append(f"SLURM_ARRAY_JOB_ID={array_job!r} SLURM_ARRAY_TASK_ID={array_task!r} do not name an "
                        "array task (both must be integers); ignored, SLURM_JOB_ID used if set")
    job_id = _get(env, "SLURM_JOB_ID")
    if not job_id:
        return None
    if job_id.isdecimal():
        return job_id, "SLURM_JOB_ID"
    warnings.append(f"SLURM_JOB_ID={job_id!r} is not a Slurm job id (an integer); ignored, the next source is used")
    return None


def _kubernetes_job(env: Mapping[str, str]) -> tuple[str, str] | None:
    if not _get(env, "KUBERNETES_SERVICE_HOST"):
        return None
    jobset = _get(env, "JOBSET_NAME")
    if jobset:
        return jobset, "JOBSET_NAME"
    for key, pattern in (("PET_MASTER_ADDR", _TRAINJOB_MASTER), ("MASTER_ADDR", _PYTORCHJOB_MASTER),
                         ("PET_RDZV_ENDPOINT", _PYTORCHJOB_RDZV)):
        match = pattern.fullmatch(_get(env, key))
        if match:
            return match["name"], key
    return None


def _non_negative(env: Mapping[str, str], key: str, warnings: list[str]) -> int | None:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_INDEX:
        warnings.append(f"{key}={raw[:40]!r} is not an integer from 0 to {MAX_INDEX}; ignored, the next source is used")
        return None
    return value


def _first(env: Mapping[str, str], keys: tuple[str, ...], what: str, torch_value: int | None,
           default: int | None) -> Resolved:
    """The first source of ``keys`` that holds a value (``torch_value`` before them), and any disagreement."""
    warnings: list[str] = []
    under_torchrun = "TORCHELASTIC_RUN_ID" in env
    found: list[tuple[str, int]] = [] if torch_value is None else [("torch.distributed", torch_value)]
    for key in keys:
        if under_torchrun and key in _OUTER_LAUNCHER_VARS:
            continue
        value = _non_negative(env, key, warnings)
        if value is not None:
            found.append((key, value))
    if not found:
        return Resolved(default, "default", tuple(warnings))
    source, value = found[0]
    others = [f"{key}={other}" for key, other in found[1:] if other != value]
    if others:
        why = ("the initialised process group is authoritative" if source == "torch.distributed"
               else f"{source} is what torch.distributed's env:// initialisation reads" if source in _TORCHRUN_VARS
               else f"{source} comes first in the order of docs/IDENTITY.md")
        warnings.append(f"{what}: {source}={value} disagrees with {', '.join(others)}; using {source} because {why}. "
                        f"If {source} was exported for the whole job, unset it or launch with torchrun")
    return Resolved(value, source, tuple(warnings))


def _dist(modules: Mapping[str, Any]) -> Any:
    """``torch.distributed`` if the training code imported it and initialised a process group, else None."""
    dist = modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # a half-initialised process group must not stop training
        pass
    return None


def _dist_value(dist: Any, getter: str) -> int | None:
    if dist is None:
        return None
    try:
        return int(getattr(dist, getter)())
    except Exception:
        return None


def resolve_rank(env: Mapping[str, str], modules: Mapping[str, Any]) -> Resolved:
    """The global rank (default 0)."""
    return _first(env, RANK_VARS, "rank", _dist_value(_dist(modules), "get_rank"), 0)


def resolve_local_rank(env: Mapping[str, str]) -> Resolved:
    """The rank within this node; ``None`` when no launcher says (a single process, or a bare ``python``)."""
    return _first(env, LOCAL_RANK_VARS, "local rank", None, None)


def resolve_world_size(env: Mapping[str, str], modules: Mapping[str, Any]) -> Resolved:
    """The number of ranks of the job (default 1)."""
    return _first(env, WORLD_SIZE_VARS, "world size", _dist_value(_dist(modules), "get_world_size"), 1)
