"""What a prediction starts from: one job's measured steps and the collectives it timed.

``load_inputs(path)`` reads a recorded run directory (``chopper.runs.rundir.read_run``, attributed
with ``chopper.attribution.attribute``) or the aggregator's step store
(``chopper.attribution.store_reader.read_step_store``) and returns ``RunInputs``:

1. **Steps** (``RunInputs.steps``, one row per step the job's every rank completed). A step is
   synchronous across ranks, so its critical path is the slowest rank's work plus the
   communication nobody could hide. Per rank ``r`` (attribution columns, seconds):
   ``compute_r = step_time − exposed_comm − idle − straggler_wait`` (unknown idle counts 0), what
   the account says is neither communication nor idle. Per step:

   - ``compute_s`` = max over ranks of ``compute_r``;
   - ``noncomm_s`` = max over ranks of ``compute_r + idle_r``: the time that is not
     communication, which a prediction keeps as measured;
   - ``exposed_comm_s`` = min over ranks of ``exposed_comm + straggler_wait``: the exposed
     communication of the rank that waited least, i.e. without anyone's wait for a late rank;
   - ``collective_s`` = Σ over the step's collectives of their seconds (below);
   - ``step_time_s``, ``ideal_s``, ``tokens`` (per rank), ``flops`` (per rank): means over ranks.

2. **Collectives** (``RunInputs.collectives``, one row per collective call of the job). Where
   the run has Inspector records of the job (``RecordedRun.collectives``: NCCL/RCCL Inspector
   records, the fields of ``CollectiveRecord``), they are used (GPU kernel time); otherwise
   the collective markers (``chopper.collective`` or ``chopper.pytorch``'s hooks). A call is the
   k-th collective of one name in one step (markers) or one ``(comm_id, seq)`` (records); its
   ``seconds`` is the **minimum over ranks** of its duration: a rank that entered early waits
   for the last one inside the call, and the last one's time is the transfer. ``size`` is the
   whole array ``S`` (``volumes.full_size``), ``world`` the communicator's ranks (records:
   ``comm_ranks``; markers: the job's ranks in the run, since markers do not name the group).
   Names that carry no volume (``barrier``, ``gather``, the job's own) and calls of no bytes are
   left out and counted in ``RunInputs.notes``.

3. ``world_size`` = the job's distinct ranks; ``bandwidth_gbs`` = the link bandwidth the run
   had, when the caller knows it (GB/s, 10⁹ bytes/s); ``peak_flops`` is implied by ``ideal_s``.

The aggregator's store holds step rows only: its inputs have steps and no collectives.

pandas is imported inside the functions (``import chopper`` stays light); this module is only
imported by ``chopper predict`` and the report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from chopper.predict import volumes

if TYPE_CHECKING:
    import pandas as pd

    from chopper.runs.rundir import RecordedRun

STEP_FRAME: tuple[str, ...] = ("step", "step_time_s", "compute_s", "noncomm_s", "idle_s", "exposed_comm_s",
                               "collective_s", "ideal_s", "tokens", "flops")
CALL_FRAME: tuple[str, ...] = ("step", "name", "collective", "source", "bytes", "size", "world", "seconds")


class PredictInputError(ValueError):
    """An input cannot be predicted from; the message names the problem and the fix."""


@dataclass(frozen=True)
class RunInputs:
    """One job's measured steps and collectives (module docstring).

    Attributes:
        label: The path it was read from.
        kind: ``"run"`` (recorded run directory) or ``"store"`` (aggregator store).
        job: The job.
        world_size: The job's ranks.
        steps: ``STEP_FRAME`` columns, one row per complete step, seconds.
        collectives: ``CALL_FRAME`` columns, one row per collective call; empty for a store.
        bandwidth_gbs: The run's link bandwidth in GB/s, or None when not given.
        notes: What was left out, and why.
    """

    label: str
    kind: str
    job: str
    world_size: int
    steps: pd.DataFrame
    collectives: pd.DataFrame
    bandwidth_gbs: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def collective_source(self) -> str:
        """``"inspector"``, ``"markers"`` or ``"none"``: where the collective timings came from."""
        if self.collectives.empty:
            return "none"
        return str(self.collectives["source"].iloc[0])


def load_inputs(path: str | Path, job: str | None = None, bandwidth_gbs: float | None = None) -> RunInputs:
    """Read one recorded run or step store into ``RunInputs`` (module docstring).

    Raises:
        PredictInputError: The path is neither, cannot be read, holds several jobs and ``job`` is
            None, or has no step that every rank completed.
    """
    from chopper.attribution import AttributionError, attribute
    from chopper.attribution.store_reader import is_step_store, read_step_store
    from chopper.runs.rundir import RunDirError, read_run

    root = Path(path)
    if bandwidth_gbs is not None and not bandwidth_gbs > 0:
        raise PredictInputError(f"{root}: the run's bandwidth must be a positive number of GB/s, got {bandwidth_gbs}")
    if not root.exists():
        raise PredictInputError(f"{root} does not exist; pass a recorded run directory (chopper record) or the "
                                "aggregator's store_dir")
    try:
        if is_step_store(root):
            steps = read_step_store(root, job=job).steps
            chosen = _one_job(steps, job, root)
            frame = _step_frame(steps[steps["job"] == chosen], None)
            return RunInputs(str(root), "store", chosen, _world(steps, chosen), frame, _empty_calls(),
                             bandwidth_gbs, ["the aggregator's store keeps step totals, not collective timings"])
        run = read_run(root)
        steps = attribute(run.devices, run.samples, run.markers, job=job, collectives=run.collectives).steps
    except (RunDirError, AttributionError) as exc:
        raise PredictInputError(str(exc)) from None
    return from_run(run, steps, job, bandwidth_gbs)


def from_run(run: RecordedRun, steps: pd.DataFrame, job: str | None = None,
             bandwidth_gbs: float | None = None) -> RunInputs:
    """``RunInputs`` of a run already read (``read_run``) and attributed (``steps``), as the report has it.

    Raises:
        PredictInputError: As ``load_inputs``.
    """
    chosen = _one_job(steps, job, run.path)
    world = _world(steps, chosen)
    notes: list[str] = []
    records = run.collectives[run.collectives["job"] == chosen]
    if not records.empty:
        calls = _record_calls(records, steps[steps["job"] == chosen], notes)
    else:
        calls = _marker_calls(run.markers[run.markers["job"] == chosen], world, notes)
    frame = _step_frame(steps[steps["job"] == chosen], calls)
    return RunInputs(str(run.path), "run", chosen, world, frame, calls, bandwidth_gbs, notes)


def _one_job(steps: pd.DataFrame, job: str | None, root: Path) -> str:
    jobs = sorted(set(steps["job"]))
    if not jobs:
        raise PredictInputError(f"{root}: no complete step (no step_begin/step_end pair); record while the job "
                                "marks steps")
    if job is None and len(jobs) > 1:
        raise PredictInputError(f"{root} holds {len(jobs)} jobs ({', '.join(jobs[:5])}); pick one with --job")
    return job if job is not None else jobs[0]


def _world(steps: pd.DataFrame, job: str) -> int:
    return int(steps.loc[steps["job"] == job, "rank"].nunique())


def _empty_calls() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({c: [] for c in CALL_FRAME})


def _step_frame(steps: pd.DataFrame, calls: pd.DataFrame | None) -> pd.DataFrame:
    """Per-step critical-path figures of one job (module docstring, 1)."""
    import numpy as np
    import pandas as pd

    ranks = steps["rank"].nunique()
    rows = steps.assign(
        idle=steps["idle_s"].fillna(0.0),
        exposed=steps["exposed_comm_s"].fillna(0.0) + steps["straggler_wait_s"].fillna(0.0),
    )
    rows = rows.assign(compute=rows["step_time_s"] - rows["exposed"] - rows["idle"])
    rows = rows.assign(noncomm=rows["compute"] + rows["idle"])
    grouped = rows.groupby("step", sort=True)
    out = pd.DataFrame({
        "ranks": grouped["rank"].nunique(),
        "step_time_s": grouped["step_time_s"].mean(),
        "compute_s": grouped["compute"].max(),
        "noncomm_s": grouped["noncomm"].max(),
        "idle_s": grouped["idle"].mean(),
        "exposed_comm_s": grouped["exposed"].min(),
        "ideal_s": grouped["ideal_s"].mean(),
        "tokens": grouped["tokens"].mean(),
        "flops": grouped["flops"].mean(),
    }).reset_index()
    out = out[out["ranks"] == ranks].drop(columns="ranks")
    if calls is not None and not calls.empty:
        per_step = calls.groupby("step")["seconds"].sum()
        out["collective_s"] = out["step"].map(per_step).fillna(0.0).to_numpy(dtype=np.float64)
    else:
        out["collective_s"] = np.nan
    return out[list(STEP_FRAME)].reset_index(drop=True)


def _canonical_calls(calls: pd.DataFrame, notes: list[str], what: str) -> pd.DataFrame:
    """Calls with a known collective and a payload; the rest counted in ``notes``."""
    calls = calls.assign(collective=calls["name"].map(volumes.canonical))
    unknown = calls[calls["collective"].isna()]
    if len(unknown):
        names = ", ".join(sorted(set(unknown["name"]))[:5])
        notes.append(f"{len(unknown)} {what} of no known volume left out ({names})")
    calls = calls[calls["collective"].notna()]
    empty = calls[~(calls["bytes"] > 0)]
    if len(empty):
        notes.append(f"{len(empty)} {what} without bytes left out")
    return calls[calls["bytes"] > 0]


def _with_size(calls: pd.DataFrame, source: str) -> pd.DataFrame:
    import numpy as np

    sizes = [volumes.full_size(c, b, int(w), source)
             for c, b, w in zip(calls["collective"], calls["bytes"], calls["world"], strict=True)]
    return calls.assign(source=source, size=np.asarray(sizes, dtype=np.float64))[list(CALL_FRAME)]


def _marker_calls(markers: pd.DataFrame, world: int, notes: list[str]) -> pd.DataFrame:
    """One row per collective call from the markers (module docstring, 2)."""
    import numpy as np

    from chopper.attribution.markers import marker_tables

    key = ["job", "rank", "step", "name"]
    intervals = marker_tables(markers).intervals
    intervals = intervals[intervals["is_collective"]].sort_values([*key, "begin_ns"], kind="stable")
    if intervals.empty:
        return _empty_calls()
    # The k-th call of a name in a step, on every rank; bytes are its markers' (attribution.markers).
    intervals = intervals.assign(nth=intervals.groupby(key, sort=False).cumcount(),
                                 seconds=(intervals["end_ns"] - intervals["begin_ns"]) / 1e9)
    calls = intervals.groupby(["step", "name", "nth"], sort=True).agg(
        seconds=("seconds", "min"), bytes=("bytes", "max")).reset_index()
    calls = calls.assign(world=np.int64(world))
    return _with_size(_canonical_calls(calls, notes, "collective calls"), "markers")


def _record_calls(records: pd.DataFrame, steps: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """One row per ``(comm_id, seq)`` from Inspector records, placed in the step of its rank whose
    window holds the record's begin (module docstring, 2)."""
    import pandas as pd

    records = records.rename(columns={"collective": "name", "comm_ranks": "world", "exec_s": "seconds"})
    windows = steps[["rank", "step", "begin_ns", "end_ns"]].sort_values("begin_ns")
    placed = pd.merge_asof(records.sort_values("begin_ns"), windows, on="begin_ns", by="rank", direction="backward",
                           suffixes=("", "_step"))
    outside = ~(placed["begin_ns"] <= placed["end_ns_step"])
    placed.loc[outside, "step"] = -1
    if outside.any():
        notes.append(f"{int(outside.sum())} Inspector records outside every step window (fit only)")
    calls = placed.groupby(["comm_id", "seq"], sort=True).agg(
        name=("name", "first"), step=("step", "max"), seconds=("seconds", "min"), bytes=("bytes", "max"),
        world=("world", "max")).reset_index()
    calls = calls[calls["world"] >= 1]
    return _with_size(_canonical_calls(calls, notes, "Inspector records"), "inspector")
