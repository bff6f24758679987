"""Where a check run came from, written beside its tables: ``PROVENANCE.md`` and ``check.json``.

``environment`` reads the facts (versions of Python, torch, its CUDA/ROCm and every package the
check loads, the driver, the commit); ``write`` puts them with the run's figures into
``check.json`` (machine-readable, NaN as null) and renders the same record as ``PROVENANCE.md``.
The driver is asked read-only, through the vendor library the backend uses.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import json
import math
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# Distributions the check and the agent load; their versions and where they were loaded from
# (the device's own site-packages or the wheels carried with the tree) go into the record.
DISTRIBUTIONS = ("torch", "numpy", "pandas", "pyarrow", "grpcio", "grpcio-health-checking", "protobuf",
                 "prometheus-client", "psutil", "nvidia-ml-py", "amdsmi")

DRIVER_FACTS = {"driver": "version", "cuda_driver": "CUDA driver", "gpm": "GPM"}
NOT_CHANGED = (
    "The check only reads the GPU: NVML or amdsmi queries (device info, clocks, power, energy, "
    "temperatures, utilisation and GPM counters, throttle residency) and CUDA/HIP timing events. It sets "
    "no power limit, no clock (locked or application clocks), no persistence, compute, ECC or MIG mode, "
    "and resets nothing."
)


def _package(name: str) -> str:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    return f"{dist.version} ({dist.locate_file('')})"


def _git_commit() -> str:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    return done.stdout.strip() if done.returncode == 0 else "unknown (not a git checkout)"


def _nvidia_driver(gpu: int) -> dict[str, str]:
    nv: Any = importlib.import_module("pynvml")
    nv.nvmlInit()
    try:
        cuda = int(nv.nvmlSystemGetCudaDriverVersion())
        handle = nv.nvmlDeviceGetHandleByIndex(gpu)
        try:
            supported = bool(nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            gpm = "supported"
            if supported:
                # One sample read, as the backend does: a driver that restricts profiling counters to
                # administrators refuses it here, and matrix_ratio is then NaN.
                buf = nv.nvmlGpmSampleAlloc()
                try:
                    nv.nvmlGpmSampleGet(handle, buf)
                finally:
                    nv.nvmlGpmSampleFree(buf)
                gpm = "supported, readable"
            else:
                gpm = "not supported by this GPU"
        except nv.NVMLError as exc:
            gpm = f"unavailable: {exc}"
        return {"driver": str(nv.nvmlSystemGetDriverVersion()),
                "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}", "gpm": gpm}
    finally:
        nv.nvmlShutdown()


def _amd_driver(gpu: int) -> dict[str, str]:
    from agent.backends.amd import import_amdsmi

    smi: Any = import_amdsmi()
    smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
    try:
        info = smi.amdsmi_get_gpu_driver_info(smi.amdsmi_get_processor_handles()[gpu])
        return {"driver": f"{info.get('driver_name', 'amdgpu')} {info.get('driver_version', '?')}"}
    finally:
        smi.amdsmi_shut_down()


def driver(vendor: str, gpu: int) -> dict[str, str]:
    """The driver's version (and on NVIDIA its CUDA version and GPM state); never raises."""
    readers = {"nvidia": _nvidia_driver, "amd": _amd_driver}
    if vendor not in readers:
        return {"driver": f"none ({vendor} backend)"}
    try:
        return readers[vendor](gpu)
    except Exception as exc:  # provenance must not fail the run it describes
        return {"driver": f"unknown ({type(exc).__name__}: {exc})"}


def environment(torch: Any, device: Any) -> dict[str, Any]:
    """Python, platform, package versions and locations, torch's build and device, the commit."""
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": _git_commit(),
        "packages": {name: _package(name) for name in DISTRIBUTIONS},
        "torch": {"version": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)},
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts["torch"] |= {"cudnn": torch.backends.cudnn.version(), "device": props.name,
                           "capability": f"{props.major}.{props.minor}",
                           "uuid": str(getattr(props, "uuid", "")), "visible_devices": torch.cuda.device_count()}
    return facts


def _clean(value: Any) -> Any:
    """JSON without NaN: unknown figures are null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _num(value: Any, fmt: str, scale: float = 1.0) -> str:
    """``value / scale`` formatted, or ``n/a`` when unknown (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value / scale, fmt)


def _pct(value: Any) -> str:
    """A ratio as a percentage; below 0.1 % in scientific notation (a CPU job against a GPU's peak)."""
    if isinstance(value, float) and 0 < abs(value) < 1e-3:
        return f"{value * 100:.3g} %"
    return _num(value, ".2%")


def figure_lines(record: dict[str, Any]) -> list[str]:
    """The figures as a Markdown table, the same lines the check prints."""
    f, loop = record["figures"], record["loop"]
    live = record["live"]
    counter_source = record["counter_source"]
    rows = [
        ("MFU, FLOP-derived (independent)", _pct(f["mfu_flops"]),
         f"{loop['steps']} steps × {loop['flops_per_step']:.4g} FLOP / "
         f"({_num(record['peak_flops'], '.1f', 1e12)} TFLOP/s × {loop['seconds']:.3f} s by {loop['timer']})"),
        ("MFU, Chopper markers (recorded run)", _pct(f["mfu_markers"]),
         f"{f['steps_attributed']} attributed steps, {f['step_time_s']:.3f} s of step windows"),
        ("MFU, Chopper live step summaries", _pct(live["mfu"]),
         f"{live['summaries']} summaries; timestamps {live['clocks']}"),
        ("MFU, counter-derived", _pct(f["mfu_counter"]),
         f"{counter_source}: tensor active {_num(f['tensor_active_ratio'], '.1%')} at "
         f"{_num(f['mean_clock_mhz'], '.0f')} / {f['max_clock_mhz']:.0f} MHz"),
    ]
    throttle = ", ".join(f"{c} {_num(v, '.3f')}" for c, v in f["throttle_s"].items())
    dvfs = ", ".join(f"{c} {_num(v, '.3f')}" for c, v in f["dvfs_s"].items())
    split = ", ".join(f"{c} {_num(v, '.3f')}" for c, v in f["split_s"].items())
    return [
        "| figure | value | from |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
        "",
        f"- Throttle residency seen by the counters over the loop, s: {throttle}",
        f"- DVFS loss Chopper attributed, s: {dvfs}",
        f"- Step time split, s: {split}",
        f"- Clock {_num(f['min_clock_mhz'], '.0f')}–{_num(f['mean_clock_mhz'], '.0f')} MHz (min–mean), "
        f"max temperature {_num(f['max_temp_c'], '.0f')} °C, mean power {_num(f['mean_power_w'], '.0f')} W",
        f"- Step flags: {', '.join(f'{k} ×{v}' for k, v in f['flags'].items()) or 'none'}",
    ]


def _markdown(record: dict[str, Any]) -> str:
    env, loop, shape, agent = record["environment"], record["loop"], record["shape"], record["agent"]
    lines = [
        f"# GPU check: {record['device']['model']}, {record['backend']} backend, {record['date']}",
        "",
        "Recorded by `make gpu-check` (docs/GPU_CHECK.md). The tables `devices`, `samples` and `markers` are a",
        "recorded run (chopper.runs.rundir); `check.json` holds this file's facts and figures.",
        "",
        "## What was run",
        "",
        f"- Command: `{record['command']}`",
        f"- Job: {shape['layers']} × `Linear({shape['width']}, {shape['width']}, bias=False)` with ReLU, batch "
        f"{shape['batch']}, {shape['dtype']}, SGD, one fixed batch; {loop['flops_per_step']:.6g} FLOP per step "
        f"(FlopCounterMode; the shapes give {loop['flops_analytic']:.6g})",
        f"- Markers: `chopper.pytorch.instrument` with the counted FLOPs, job `{record['job']}`, rank 0, gpu "
        f"{record['device']['gpu']} ({record['identity']})",
        f"- {record['warmup_s']:g} s warm-up, then {loop['steps']} steps in {loop['seconds']:.3f} s "
        f"({loop['timer']}); recorded {record['recorded']}",
        f"- Agent: `python -m agent --backend {agent['backend']}` at {agent['sample_hz']:g} Hz, version "
        f"{agent['version']}",
        "",
        "## Device",
        "",
        "| gpu | model | uuid | max clock MHz | power cap W | memory GiB | peak TFLOP/s |",
        "|---|---|---|---|---|---|---|",
        *(f"| {d['gpu']} | {d['model']} | {d['uuid']} | {d['max_gfx_clock_mhz']:g} | {_num(d['power_cap_w'], 'g')} | "
          f"{d['memory_bytes'] / 2**30:.1f} | {_num(d['peak_flops'], '.1f', 1e12)} |" for d in record["devices"]),
        "",
        "Driver: " + "; ".join(f"{DRIVER_FACTS.get(k, k)} {v}" for k, v in record["driver"].items()),
        "",
        "## Software",
        "",
        f"- Python {env['python']} on {env['platform']}; commit {env['commit']}",
        f"- torch {env['torch']['version']}: "
        + ", ".join(f"{k} {v}" for k, v in env["torch"].items() if k != "version"),
        *(f"- {name}: {where}" for name, where in env["packages"].items()),
        "",
        "## Figures",
        "",
        *figure_lines(record),
        "",
        "## What the check did not change",
        "",
        NOT_CHANGED,
        "",
    ]
    return "\n".join(lines)


def write(out: Path, record: dict[str, Any]) -> None:
    """Write ``check.json`` and ``PROVENANCE.md`` into the run directory ``out``."""
    clean = _clean(record)
    (out / "check.json").write_text(json.dumps(clean, indent=1) + "\n")
    (out / "PROVENANCE.md").write_text(_markdown(clean))


def read(run_dir: Path) -> dict[str, Any]:
    """The record of a check run (``check.json``)."""
    return dict(json.loads((run_dir / "check.json").read_text()))


__all__ = ["NOT_CHANGED", "driver", "environment", "figure_lines", "read", "write"]
