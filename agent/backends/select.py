"""Choose the backend named in the settings, or detect one.

``auto`` tries ``amd`` then ``nvidia`` (each by opening and closing it once); where neither finds
a GPU it falls back to ``simulated`` and says so plainly in the log, so simulated telemetry is
never mistaken for real hardware. Vendor modules are imported only when their backend is tried.
"""
from __future__ import annotations

import logging

from agent.backends.base import Backend, BackendUnavailable
from agent.config import AgentSettings

log = logging.getLogger(__name__)


def create_backend(name: str, settings: AgentSettings) -> Backend:
    """Construct (without opening) the backend called ``name``."""
    if name == "amd":
        from agent.backends.amd import AmdBackend

        return AmdBackend(settings.node)
    if name == "nvidia":
        from agent.backends.nvidia import NvidiaBackend

        return NvidiaBackend(settings.node)
    if name == "simulated":
        from agent.backends.simulated import AGENT_LAG_S, SimulatedBackend

        return SimulatedBackend(
            settings.node, model=settings.sim_model, gpus=settings.sim_gpus, seed=settings.sim_seed,
            hot_gpus=settings.sim_hot_gpus, power_cap_w=settings.sim_power_cap_w or None,
            health_events=settings.sim_health_events, partition=settings.sim_partition,
            memory_partition=settings.sim_memory_partition, lag_s=AGENT_LAG_S,
        )
    if name == "replay":
        from agent.backends.replay import ReplayBackend

        return ReplayBackend(settings.node, settings.replay_dir, speed=settings.replay_speed)
    raise ValueError(f"unknown backend {name!r}")


def select_backend(settings: AgentSettings) -> Backend:
    """The configured backend, or for ``auto`` the first vendor backend that finds a GPU.

    Raises:
        BackendUnavailable: Only for an explicitly named backend that cannot run here.
    """
    if settings.backend != "auto":
        return create_backend(settings.backend, settings)
    reasons = []
    for name in ("amd", "nvidia"):
        backend = create_backend(name, settings)
        try:
            backend.open()
        except BackendUnavailable as exc:
            reasons.append(f"{name}: {exc}")
            continue
        except Exception as exc:  # a vendor library that half-works is still "not here" for auto
            reasons.append(f"{name}: {exc!r}")
            continue
        finally:
            backend.close()
        log.info("event=backend_detected backend=%s", name)
        return backend
    log.warning(
        "event=no_gpu_found backend=simulated detail=%r",
        "no GPU answered through amdsmi or NVML; serving SIMULATED GPUs (vendor=simulated). " + "; ".join(reasons),
    )
    return create_backend("simulated", settings)
