"""Column contract of attribution results: one row per (job, rank, step).

Times are seconds, clocks MHz, energy joules. Closure holds on every row whose ``ideal_s`` is
known: ``ideal_s + matrix_util_loss_s + dvfs_loss_s + exposed_comm_s + straggler_wait_s + idle_s
== step_time_s``; ``dvfs_loss_s`` is the sum of the ``dvfs_<cause>_s`` columns. Where ``flops``
is missing, ``ideal_s``, ``matrix_util_loss_s`` and ``mfu`` are NaN (flag ``no_flops``) and
``compute_at_clock_s`` (their sum) closes the account instead. ``phase_s`` maps each phase name
of the step to its seconds (``phases.phase_seconds``: the union of that name's windows); phases
may nest or overlap, so these do not add up to the step time.
"""
from __future__ import annotations

DVFS_CAUSES: tuple[str, ...] = ("power", "thermal", "current", "other", "unattributed")

KEY_COLUMNS: tuple[str, ...] = ("job", "rank", "step")

STEP_COLUMNS: tuple[str, ...] = (
    "job", "rank", "step", "node", "gpu", "begin_ns", "end_ns",
    "step_time_s",
    "ideal_s", "matrix_util_loss_s", "compute_at_clock_s",
    "dvfs_loss_s", *(f"dvfs_{c}_s" for c in DVFS_CAUSES),
    "exposed_comm_s", "straggler_wait_s", "idle_s",
    "mfu", "busy_ratio", "matrix_ratio", "mean_gfx_clock_mhz", "min_gfx_clock_mhz", "max_temp_c",
    "energy_j", "flops", "tokens", "tokens_per_s", "tokens_per_j",
    "flags", "phase_s",
)
# Offline rows (``chopper attribute`` of a recorded run) also carry where their collectives came from
# (``collective_source.step_collectives``): ``collective_source`` ("markers", "inspector" or "none"),
# which ``exposed_comm_s`` is computed from; ``collective_s``, the union of that source's intervals;
# ``collective_bytes``, their bytes; the Inspector's own view whatever the source
# (``inspector_collective_s`` and ``inspector_bytes``, NaN where no Inspector record covers the rank;
# ``inspector_collectives``, records ended in the step); and ``collective_disagreement_s``, |marked
# union − Inspector union| where the job marks collectives and the Inspector covers the rank.
# Live summaries carry the same figures as StepSummary fields; rows read from the aggregator's
# store do not carry these columns.
COLLECTIVE_COLUMNS: tuple[str, ...] = (
    "collective_source", "collective_s", "collective_bytes", "inspector_collective_s", "inspector_bytes",
    "inspector_collectives", "collective_disagreement_s",
)
# Offline rows also carry the step's NVLink / XGMI traffic: the growth of its GPU's summed link
# counters (all links, sent and received) over the step window, bytes; NaN where the samples read
# none. Live summaries carry them as StepSummary fields; rows read from the aggregator's store do
# not. Beside collective_bytes they show traffic no collective claims (docs/ATTRIBUTION.md).
LINK_COLUMNS: tuple[str, ...] = ("link_tx_bytes", "link_rx_bytes")
# Offline rows also carry ``gpu_errors``: the kinds of the step's GPU's health counters that moved
# during the step (``gpu_errors.moved_kinds``), a sorted tuple, empty for most steps; the step then
# carries the flag gpu_errors. Live summaries carry them as StepSummary.gpu_errors.
HEALTH_COLUMNS: tuple[str, ...] = ("gpu_errors",)
# Columns a reader of stored rows may find missing (rows written before they existed): filled empty.
OPTIONAL_COLUMNS: tuple[str, ...] = ("phase_s",)

# Every flag a step can carry (``flags`` holds a tuple of these), with its meaning.
FLAGS: dict[str, str] = {
    "no_flops": "the step_end marker carried no FLOPs: ideal_s, matrix_util_loss_s and mfu are unknown",
    "ideal_exceeds_compute": "FLOPs / peak exceed the compute time at the observed clock: FLOPs or peak are "
    "wrong; ideal_s is capped so the account still closes",
    "no_peak": "the device's peak FLOP/s is unknown (set the agent's peak_flops): ideal_s and mfu are unknown",
    "no_samples": "no GPU sample covers the step: idle and DVFS terms are unknown (0), the step is compute",
    "partial_samples": "GPU samples cover only part of the step window",
    "no_gpu": "the rank drives no GPU of a known device (gpu -1 or not in devices)",
    "comm_capped": "exposed communication was capped so that idle + exposed <= step time",
    "cpu_clock": "markers were stamped with the CPU clock, not device events: windows lead the GPU work by the "
    "launch queue (live summaries only; recorded runs do not carry the clock source)",
    "unknown_device": "the rank's GPU could not be placed on its node (a UUID it lacks, an index beyond its GPUs, "
    "or the client's unresolved: report): no GPU's samples were joined (live summaries only; docs/IDENTITY.md)",
    "bad_flops": "the step_end's flops was negative or not finite and was dropped, so the step counts as no_flops "
    "(live summaries only)",
    "bad_tokens": "the step_end's tokens was negative and was dropped (0) (live summaries only)",
    "bad_bytes": "a collective of the step carried negative bytes, dropped (0) (live summaries only)",
    "slowest_rank": "this rank had the largest compute time of its job at this step (job level)",
    "gpu_errors": "a health or error counter of the step's GPU (ECC, XID, PCIe replay, NVLink/XGMI error, retired "
    "page or row) moved during the step; the kinds are in gpu_errors (docs/HEALTH.md)",
    "inspector_unplaced": "an Inspector record of the step had no event timestamps (the plugin's non-verbose "
    "dump): it was placed to end at its dump time, late by up to the plugin's dump interval (docs/INSPECTOR.md)",
}
