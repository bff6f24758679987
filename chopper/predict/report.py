"""Render a ``Prediction`` for people (text) and programs (JSON).

JSON shape (``chopper predict --json``)::

    {"target": {"world_size", "bandwidth_gbs", "parallelism", "algorithm"},
     "prediction": {"step_time_s", "uncertainty_s", "noncomm_s", "compute_s", "comm_s",
                    "exposed_comm_s", "exposed_share", "tokens_per_s", "mfu"},
     "collectives": [{"collective", "size_bytes", "calls_per_step", "seconds", "fit"}, ...],
     "fits": [{"collective", "algorithm", "alpha_s", "beta", "beta_unit", "effective_bandwidth_gbs",
               "scaled", "pairs", "rms_s", "rms_rel", "max_rel", "size_bytes": [lo, hi],
               "world_sizes": [lo, hi], "bandwidths_gbs": [lo, hi] | null, "alpha_fixed", "notes"}, ...],
     "refused_fits": {"<collective>": "reason", ...},
     "inputs": [{"path", "kind", "job", "world_size", "bandwidth_gbs", "steps", "collective_calls",
                 "collective_source", "step_time_s", "noncomm_s"}, ...],
     "notes": [...]}

Seconds per step; unknown values (NaN) are ``null``.
"""
from __future__ import annotations

import math
from typing import Any

from chopper.predict.fit import Fit
from chopper.predict.model import Prediction


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def fit_json(fit: Fit) -> dict[str, Any]:
    """One fit as JSON (module docstring)."""
    return {
        "collective": fit.collective, "algorithm": fit.algorithm, "alpha_s": fit.alpha_s, "beta": fit.beta,
        "beta_unit": "share of the run bandwidth (multiplies V/B)" if fit.scaled else "seconds per bus byte",
        "effective_bandwidth_gbs": None if fit.scaled else _clean(fit.effective_bandwidth_gbs),
        "scaled": fit.scaled, "pairs": fit.pairs, "rms_s": fit.rms_s, "rms_rel": fit.rms_rel, "max_rel": fit.max_rel,
        "size_bytes": list(fit.sizes), "world_sizes": list(fit.worlds),
        "bandwidths_gbs": None if fit.bandwidths is None else list(fit.bandwidths),
        "alpha_fixed": fit.alpha_fixed, "notes": list(fit.notes),
    }


def to_json(p: Prediction) -> dict[str, Any]:
    """The ``--json`` document (module docstring)."""
    keys = ("step_time_s", "uncertainty_s", "noncomm_s", "compute_s", "comm_s", "exposed_comm_s", "exposed_share",
            "tokens_per_s", "mfu")
    return {
        "target": {"world_size": p.world_size, "bandwidth_gbs": p.bandwidth_gbs, "parallelism": p.parallelism,
                   "algorithm": p.algorithm},
        "prediction": {k: _clean(getattr(p, k)) for k in keys},
        "collectives": [{"collective": c.collective, "size_bytes": c.size, "calls_per_step": c.calls_per_step,
                         "seconds": c.seconds, "fit": c.fit} for c in p.plan],
        "fits": [fit_json(f) for f in p.fits.values()],
        "refused_fits": dict(p.refused_fits),
        "inputs": [{k: _clean(v) for k, v in i.items()} for i in p.inputs],
        "notes": list(p.notes),
    }


def format_fits(fits: dict[str, Fit], refused: dict[str, str]) -> list[str]:
    """One line per fit with its residuals, then the refused ones with the reason."""
    lines = ["fits (t = α·L + β·V):"]
    for f in fits.values():
        if f.scaled:
            bandwidth = f"β {f.beta:.3g} (link reached {100 / f.beta:.0f}% of the run bandwidth)"
        else:
            bandwidth = f"β {f.beta * 1e9:.3g} s/GB (effective {f.effective_bandwidth_gbs:.3g} GB/s)"
        fixed = " fixed" if f.alpha_fixed else ""
        lines.append(
            f"  {f.collective:<15} {f.algorithm}  α {f.alpha_s * 1e6:.1f} µs{fixed}  {bandwidth}  {f.pairs} pairs, "
            f"RMS {f.rms_s * 1e3:.2f} ms ({100 * f.rms_rel:.1f}%), max {100 * f.max_rel:.1f}%, "
            f"S {f.sizes[0]:.3g}–{f.sizes[1]:.3g} B, N {f.worlds[0]}–{f.worlds[1]}"
            + ("" if f.bandwidths is None else f", B {f.bandwidths[0]:g}–{f.bandwidths[1]:g} GB/s"))
        lines += [f"    {n}" for n in f.notes]
    lines += [f"  {c:<15} refused: {reason}" for c, reason in refused.items()]
    return lines


def format_text(p: Prediction) -> str:
    """The text output: inputs, fits with residuals, the predicted step and its collectives."""
    lines = ["inputs:"]
    for i in p.inputs:
        bw = "?" if i["bandwidth_gbs"] is None else f"{i['bandwidth_gbs']:g} GB/s"
        lines.append(f"  {i['path']}: job {i['job']}, N={i['world_size']}, {bw}, {i['steps']} steps, "
                     f"{i['collective_calls']} collective calls ({i['collective_source']}), measured step "
                     f"{1e3 * i['step_time_s']:.1f} ms")
    lines += format_fits(p.fits, p.refused_fits)
    bw = "the runs' bandwidth" if p.bandwidth_gbs is None else f"{p.bandwidth_gbs:g} GB/s"
    what = f", {p.parallelism}" if p.parallelism else ""
    lines.append(f"\nprediction at N={p.world_size}, {bw}{what} ({p.algorithm}; weak scaling: per-rank batch kept):")
    rows = (("step time", f"{1e3 * p.step_time_s:.1f} ± {1e3 * p.uncertainty_s:.1f} ms"),
            ("not communication", f"{1e3 * p.noncomm_s:.1f} ms (compute {1e3 * p.compute_s:.1f} ms), as measured"),
            ("communication", f"{1e3 * p.comm_s:.1f} ms"),
            ("exposed comm", f"{1e3 * p.exposed_comm_s:.1f} ms ({100 * p.exposed_share:.0f}% exposed, as measured)"),
            ("tokens/s", f"{p.tokens_per_s:,.0f}" if math.isfinite(p.tokens_per_s) else "unknown"),
            ("MFU", f"{100 * p.mfu:.3g}%" if math.isfinite(p.mfu) else "unknown (no FLOPs or peak)"))
    lines += [f"  {name:<18} {value}" for name, value in rows]
    lines.append("  collectives per step:")
    lines += [f"    {c.calls_per_step:g} × {c.collective} of {c.size:.4g} B: {1e3 * c.seconds:.2f} ms each "
              f"(fit {c.fit})" for c in p.plan]
    if p.notes:
        lines.append("notes:")
        lines += [f"  {n}" for n in p.notes]
    return "\n".join(lines)
