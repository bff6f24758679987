"""Who a training process is (job, rank, GPU) and where its agent listens, from the environment.

Resolved once, at ``chopper.init``, never on the hot path. Launchers differ in what they export
(torchrun, Slurm, plain ``RANK``), so each value tries the sources in a fixed order. A malformed
variable never raises into training: it is logged once, naming the variable, and the next
source is used.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("chopper.client")

DEFAULT_AGENT = "unix:///run/chopper/agent.sock"


def default_job(env: Mapping[str, str]) -> str:
    """The job id: ``CHOPPER_JOB``, else ``TORCHELASTIC_RUN_ID``, else ``SLURM_JOB_ID``, else ``default``."""
    for key in ("CHOPPER_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        value = env.get(key, "").strip()
        if value:
            return value
    return "default"


def _env_int(env: Mapping[str, str], key: str) -> int | None:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        logger.warning("event=bad_env_var var=%s value=%r reason=%s", key, raw, "not an integer; ignored")
        return None


def default_rank(env: Mapping[str, str], modules: Mapping[str, Any] | None = None) -> int:
    """The global rank: ``torch.distributed`` when initialised, else ``RANK``, else 0.

    torch is consulted only when the training code already imported it (``modules`` is
    ``sys.modules`` by default): importing torch here would cost seconds and memory.
    """
    modules = sys.modules if modules is None else modules
    dist = modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:  # a half-initialised process group must not stop training
            pass
    rank = _env_int(env, "RANK")
    return 0 if rank is None else rank


def default_gpu(env: Mapping[str, str], modules: Mapping[str, Any] | None = None) -> int:
    """The local GPU index: ``LOCAL_RANK``, else torch's current device, else -1 (no GPU)."""
    gpu = _env_int(env, "LOCAL_RANK")
    if gpu is not None:
        return gpu
    modules = sys.modules if modules is None else modules
    torch = modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        except Exception:
            pass
    return -1


def default_agent(env: Mapping[str, str]) -> str:
    """The agent's gRPC target: ``CHOPPER_AGENT``, else ``unix:///run/chopper/agent.sock``."""
    value = env.get("CHOPPER_AGENT", "").strip()
    return value or DEFAULT_AGENT
