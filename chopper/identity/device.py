"""Which physical GPU a training process drives, from what the process really sees.

Pure functions of an environment mapping and ``sys.modules``: no I/O, no logging, never raise
on bad input. The result names the device the way the node agent can check it: the agent's
device index where the environment gives one, the vendor UUID where it names one (the agent maps
UUIDs to its devices, and a UUID wins over an index, docs/IDENTITY.md). Algorithm:

1. ``CHOPPER_GPU`` (an agent device index or a UUID) is taken as given.
2. The visible list: each visibility variable selects from the list the previous one left,
   by position (an index) or by name (a UUID names a device wherever it is):

   * NVIDIA: ``NVIDIA_VISIBLE_DEVICES`` (the container toolkit: host indices or UUIDs; ``all``
     or unset: every device; ``none``: no device; ``void`` or a device-list path: the container
     holds devices whose host identity only torch can tell), then ``CUDA_VISIBLE_DEVICES``.
   * ROCm (``ROCR_VISIBLE_DEVICES`` or ``HIP_VISIBLE_DEVICES`` is set, or torch is a ROCm
     build): ``ROCR_VISIBLE_DEVICES``, then ``GPU_DEVICE_ORDINAL``, then ``HIP_VISIBLE_DEVICES``
     (else ``CUDA_VISIBLE_DEVICES``, which HIP reads the same way). ``GPU_DEVICE_ORDINAL`` alone
     does not mean ROCm: Slurm sets it for OpenCL on every GPU node, and CUDA ignores it.

   A variable whose value repeats the previous one is a copy (Slurm's GPU plugin sets
   ``CUDA_VISIBLE_DEVICES``, ``GPU_DEVICE_ORDINAL`` and ``ROCR_VISIBLE_DEVICES`` alike) and is
   skipped. A negative entry or ``NoDevFiles`` ends a list (the idiom for "no GPU"); an entry that
   is neither an index nor a UUID ends it too, as CUDA does, with a warning.
3. The ordinal the process uses within that list: torch's current device when torch has already
   initialised CUDA/HIP (never initialised here), else 0 when one device is visible, else the
   local rank (the ``torch.cuda.set_device(local_rank)`` convention), else 0. With no visibility
   variable the ordinal is the agent's index itself, and a process with neither a local rank nor
   a torch device drives no GPU (-1).
4. Torch's device UUID (CUDA builds, where ``get_device_properties().uuid`` is the NVML UUID
   without its ``GPU-`` prefix) names the device over everything the environment says.

A device the process sees but cannot be named (an ordinal beyond the list, an index beyond the
list it selects from, a container mapping only torch knows) gives ``uuid`` = ``unresolved:`` and
why: the agent flags its steps ``unknown_device`` instead of joining them with another GPU.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

UNRESOLVED = "unresolved:"
MAX_UUID_CHARS = 160  # what one MarkerBatch carries; a reason longer than this is cut

_UUID = re.compile(r"[A-Za-z]+-[0-9A-Za-z/_-]+")
_NO_DEVICE = re.compile(r"-\d+|NoDevFiles")
_ROCM_VARS = ("ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "HIP_VISIBLE_DEVICES")


@dataclass(frozen=True, slots=True)
class Unknown:
    """A visible device whose host identity cannot be told from the environment."""

    why: str


Entry = int | str | Unknown
# What the process can use, in its own ordinal order: None for every device (ordinal = agent index),
# or an Unknown for a container whose devices only torch can name.
Visible = list[Entry] | Unknown | None


@dataclass(frozen=True, slots=True)
class Device:
    """The rank's device: ``gpu`` (agent index, -1 unknown or none), ``uuid`` ("" none), how, and warnings."""

    gpu: int
    uuid: str
    source: str
    warnings: tuple[str, ...] = ()


def canonical_uuid(uuid: str) -> str:
    """``uuid`` in the one form both sides compare: lower case, no ``GPU-`` prefix, no dashes.

    NVML names a GPU ``GPU-<uuid>`` and torch the same ``<uuid>`` bare; a MIG instance keeps its
    ``mig`` prefix so that it never matches its parent GPU.
    """
    u = uuid.strip().lower()
    u = u.removeprefix("gpu-")
    return u.replace("-", "")


def match_uuid(uuid: str, canonical: Mapping[str, int]) -> int | None:
    """The device index of ``uuid`` in ``{canonical_uuid: index}``: exact, else a unique prefix (CUDA accepts one)."""
    key = canonical_uuid(uuid)
    if not key:
        return None
    if key in canonical:
        return canonical[key]
    hits = [index for full, index in canonical.items() if full.startswith(key)]
    return hits[0] if len(hits) == 1 else None


def _describe(chain: list[str]) -> str:
    return " then ".join(chain) if chain else "no visibility variable"


def _select(prev: Visible, var: str, raw: str, chain: list[str], warnings: list[str]) -> list[Entry]:
    """Apply one visibility variable to what ``prev`` left visible."""
    out: list[Entry] = []
    for token in (t.strip() for t in raw.split(",")):
        if not token or _NO_DEVICE.fullmatch(token):
            break  # "", "-1", "NoDevFiles": no device from here on, as intended
        if token.isdecimal():
            i = int(token)
            if prev is None:
                out.append(i)
            elif isinstance(prev, Unknown):
                out.append(prev)
            elif i < len(prev):
                out.append(prev[i])
            else:
                out.append(Unknown(f"{var} entry {i} is beyond the {len(prev)} devices of {_describe(chain)}"))
        elif _UUID.fullmatch(token):
            out.append(token)
        else:
            warnings.append(f"{var}={raw!r}: entry {token!r} is neither a device index nor a UUID, so the "
                            "runtime sees no device from it on; list indices or UUIDs (GPU-..., MIG-...)")
            break
    chain.append(f"{var}={raw!r}")
    return out


def _container(raw: str, chain: list[str], warnings: list[str]) -> Visible:
    """What ``NVIDIA_VISIBLE_DEVICES`` puts in a container."""
    value = raw.strip()
    if value in ("", "all"):
        return None
    if value == "none":
        chain.append(f"NVIDIA_VISIBLE_DEVICES={raw!r}")
        return []
    if value == "void" or value.startswith("/"):
        chain.append(f"NVIDIA_VISIBLE_DEVICES={raw!r}")
        return Unknown(f"NVIDIA_VISIBLE_DEVICES={raw!r}: the container's devices were injected another way (CDI "
                       "or volume mounts) and only torch's device UUID tells which host GPU they are")
    return _select(None, "NVIDIA_VISIBLE_DEVICES", raw, chain, warnings)


def _visible(env: Mapping[str, str], rocm: bool, chain: list[str], warnings: list[str]) -> Visible:
    """The devices the process can use, by the rules of the module docstring."""
    if rocm:
        stages = [(k, env[k]) for k in _ROCM_VARS[:2] if k in env]
        hip = "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in env else "CUDA_VISIBLE_DEVICES"
        if hip in env:
            if "HIP_VISIBLE_DEVICES" in env and env.get("CUDA_VISIBLE_DEVICES", env[hip]) != env[hip]:
                warnings.append(f"HIP_VISIBLE_DEVICES={env[hip]!r} and CUDA_VISIBLE_DEVICES="
                                f"{env['CUDA_VISIBLE_DEVICES']!r} differ; HIP uses HIP_VISIBLE_DEVICES")
            stages.append((hip, env[hip]))
        visible: Visible = None
    else:
        visible = _container(env["NVIDIA_VISIBLE_DEVICES"], chain, warnings) if "NVIDIA_VISIBLE_DEVICES" in env \
            else None
        stages = [("CUDA_VISIBLE_DEVICES", env["CUDA_VISIBLE_DEVICES"])] if "CUDA_VISIBLE_DEVICES" in env else []
        if stages and "NVIDIA_VISIBLE_DEVICES" in env and env["NVIDIA_VISIBLE_DEVICES"].strip() == stages[0][1].strip():
            stages = []  # a copy of the container's list, not a selection from it
    previous = None
    for var, raw in stages:
        if previous is not None and raw.strip() == previous.strip():
            continue
        visible = _select(visible, var, raw, chain, warnings)
        previous = raw
    return visible


def _torch_device(modules: Mapping[str, Any]) -> tuple[int | None, str, bool]:
    """(ordinal, UUID, ROCm build) of torch's current device; (None, "", …) unless torch already initialised one."""
    torch = modules.get("torch")
    if torch is None:
        return None, "", False
    try:
        rocm = bool(getattr(torch.version, "hip", None))
        cuda = torch.cuda
        if not cuda.is_initialized():
            return None, "", rocm
        ordinal = int(cuda.current_device())
        if rocm:  # HIP's device UUID is not in the form amdsmi reports
            return ordinal, "", rocm
        uuid = str(cuda.get_device_properties(ordinal).uuid)
        return ordinal, uuid if uuid.upper().startswith(("GPU-", "MIG-")) else "GPU-" + uuid, rocm
    except Exception:  # torch in a half-initialised state must not stop training
        return None, "", False


def _entry_device(entry: Entry, source: str, warnings: list[str]) -> Device:
    if isinstance(entry, Unknown):
        return Device(-1, (UNRESOLVED + entry.why)[:MAX_UUID_CHARS], source, tuple(warnings))
    if isinstance(entry, int):
        return Device(entry, "", source, tuple(warnings))
    return Device(-1, entry, source, tuple(warnings))


def resolve_device(env: Mapping[str, str], local_rank: int | None, modules: Mapping[str, Any],
                   local_rank_source: str = "LOCAL_RANK") -> Device:
    """The rank's device, by the algorithm of the module docstring."""
    warnings: list[str] = []
    explicit = env.get("CHOPPER_GPU", "").strip()
    if explicit:
        if explicit.isdecimal():
            return Device(int(explicit), "", f"CHOPPER_GPU={explicit}")
        if _UUID.fullmatch(explicit):
            return Device(-1, explicit, f"CHOPPER_GPU={explicit}")
        warnings.append(f"CHOPPER_GPU={explicit!r} is neither an agent device index nor a UUID; ignored")
    torch_ordinal, torch_uuid, rocm_build = _torch_device(modules)
    rocm = rocm_build or "ROCR_VISIBLE_DEVICES" in env or "HIP_VISIBLE_DEVICES" in env
    chain: list[str] = []
    visible = _visible(env, rocm, chain, warnings)
    if torch_ordinal is not None:
        ordinal, how = torch_ordinal, "torch.cuda.current_device()"
    elif isinstance(visible, list) and len(visible) == 1:
        ordinal, how = 0, "its only device"
    elif local_rank is not None:
        ordinal, how = local_rank, f"{local_rank_source}={local_rank}"
    elif visible is not None:
        ordinal, how = 0, "device 0"
    else:
        return Device(-1, "", "no visibility variable, local rank or torch device", tuple(warnings))
    source = f"{_describe(chain)}, {how}"
    if visible is None:
        entry: Entry = ordinal
    elif isinstance(visible, Unknown):
        entry = visible
    elif ordinal < len(visible):
        entry = visible[ordinal]
    elif not visible:
        return Device(-1, "", f"{_describe(chain)}: no device", tuple(warnings))
    else:
        entry = Unknown(f"ordinal {ordinal} ({how}) is beyond the {len(visible)} devices of {_describe(chain)}")
    if not torch_uuid:
        if isinstance(entry, Unknown):
            warnings.append(f"cannot tell which GPU this rank drives: {entry.why}; its steps are flagged "
                            "unknown_device. Fix the variable, call chopper.init() after torch.cuda.set_device(), "
                            "or set CHOPPER_GPU")
        return _entry_device(entry, source, warnings)
    if isinstance(entry, str) and canonical_uuid(entry) != canonical_uuid(torch_uuid):
        warnings.append(f"{_describe(chain)} names {entry} for this rank, but torch's current device is "
                        f"{torch_uuid}; using torch's")
    gpu = entry if isinstance(entry, int) else -1
    return Device(gpu, torch_uuid, f"torch device UUID ({source})", tuple(warnings))
