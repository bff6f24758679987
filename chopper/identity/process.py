"""Who a training process is (job, rank, GPU) and where its agent listens, resolved once at ``chopper.init``.

The rules live in ``chopper.identity.launcher`` (job, rank, local rank, world size) and
``chopper.identity.device`` (the physical GPU), as pure functions; this module applies them to
the process's environment and logs what they found: each warning once per process (``init``
may run many times), and one ``event=identity`` line saying what was resolved from where.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chopper.identity import device as device_identity
from chopper.identity import launcher as launcher_identity

logger = logging.getLogger("chopper.client")

DEFAULT_AGENT = "unix:///run/chopper/agent.sock"

_warned: set[str] = set()


@dataclass(frozen=True, slots=True)
class Identity:
    """What ``chopper.init`` sends: job, rank, agent GPU index (-1 none) and device UUID ("" none)."""

    job: str
    rank: int
    gpu: int
    device_uuid: str
    device_source: str


def default_job(env: Mapping[str, str]) -> str:
    """The job id by ``chopper.identity.launcher.resolve_job`` (``"default"`` when nothing names one); logs nothing."""
    return str(launcher_identity.resolve_job(env).value)


def default_agent(env: Mapping[str, str]) -> str:
    """The agent's gRPC target: ``CHOPPER_AGENT``, else ``unix:///run/chopper/agent.sock``."""
    value = env.get("CHOPPER_AGENT", "").strip()
    return value or DEFAULT_AGENT


def _warn(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning("event=identity_problem problem=%r", message)


def resolve(env: Mapping[str, str], modules: Mapping[str, Any] | None = None, job: str | None = None,
            rank: int | None = None, gpu: int | None = None) -> Identity:
    """The identity from ``env`` and ``modules`` (``sys.modules``), except the values given explicitly.

    Never raises: a failure of the rules themselves falls back to job ``default``, rank 0, no GPU.
    """
    modules = sys.modules if modules is None else modules
    try:
        return _resolve(env, modules, job, rank, gpu)
    except Exception as e:  # identity is telemetry's, never training's problem
        _warn(f"identity resolution failed ({type(e).__name__}: {e}); using job 'default', rank 0, no GPU")
        return Identity(job or launcher_identity.DEFAULT_JOB, rank or 0, -1 if gpu is None else gpu, "", "error")


def _resolve(env: Mapping[str, str], modules: Mapping[str, Any], job: str | None, rank: int | None,
             gpu: int | None) -> Identity:
    found: dict[str, launcher_identity.Resolved] = {}
    if job is None:
        found["job"] = launcher_identity.resolve_job(env)
        job = str(found["job"].value)
    if rank is None:
        found["rank"] = launcher_identity.resolve_rank(env, modules)
        found["world_size"] = size = launcher_identity.resolve_world_size(env, modules)
        rank = int(found["rank"].value)
        if size.source != "default" and rank >= size.value:
            _warn(f"rank {rank} ({found['rank'].source}) is not below the world size {size.value} ({size.source}); "
                  "one of the launcher's variables is stale: set RANK and WORLD_SIZE together")
    device: device_identity.Device | None = None
    if gpu is None:
        found["local_rank"] = local = launcher_identity.resolve_local_rank(env)
        device = device_identity.resolve_device(env, local.value, modules, local.source)
        gpu = device.gpu
    for message in [m for r in found.values() for m in r.warnings] + list(device.warnings if device else ()):
        _warn(message)
    identity = Identity(job, rank, gpu, device.uuid if device else "",
                        device.source if device else "chopper.init(gpu=)")
    logger.info("event=identity job=%r rank=%d gpu=%d device_uuid=%r device_source=%r sources=%r", identity.job,
                identity.rank, identity.gpu, identity.device_uuid, identity.device_source,
                {what: f"{r.source}={r.value}" for what, r in found.items()})
    return identity
