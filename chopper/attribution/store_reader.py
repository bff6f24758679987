"""Read the aggregator's Parquet step store back as an ``Attribution`` (``chopper attribute STORE_DIR``).

The store (``aggregator/store.py``) is ``root/job=<job>/date=<YYYY-MM-DD>/part-<n>.parquet``,
one row per (job, rank, step) with the attribution columns already split at job level
(``straggler_wait_s`` moved out of ``exposed_comm_s``), plus the aggregator's job columns.

Algorithm of ``read_step_store``:

1. Read every part file as one Hive-partitioned dataset, ``job`` and ``date`` as text (a job
   named ``123`` stays text), keeping only ``job`` when one is asked for. The schema is the union
   of every file's, so files written before a column existed (``columns.OPTIONAL_COLUMNS``) read
   alongside newer ones; that column is empty in their rows.
2. Order rows by job, step, rank, turn ``flags`` back into tuples and ``phase_s`` (a Parquet
   map) back into dicts.
3. Name the slowest rank of each step again with ``straggler.slowest_ranks`` on the rows that
   took part in the step's finalization (``late`` rows did not), with compute time before the
   split: ``step − idle − exposed − straggler wait`` (unknown idle as 0). This is what the
   aggregator computed live.

pandas and pyarrow are imported inside the functions, because ``import chopper`` must stay light.
"""
from __future__ import annotations

from pathlib import Path

from chopper.attribution.columns import OPTIONAL_COLUMNS, STEP_COLUMNS
from chopper.attribution.model import Attribution, AttributionError


def is_step_store(path: str | Path) -> bool:
    """True when ``path`` is a directory laid out as the aggregator's step store."""
    root = Path(path)
    return root.is_dir() and any(p.is_dir() for p in root.glob("job=*"))


def read_step_store(path: str | Path, job: str | None = None) -> Attribution:
    """Stored rows of every job (or of ``job``) as an ``Attribution`` (module docstring).

    Raises:
        AttributionError: The store cannot be read, lacks attribution columns, has no rows, or
            has no rows of ``job``.
    """
    import pyarrow as pa
    import pyarrow.dataset as ds

    from chopper.attribution import straggler

    root = Path(path)
    try:
        partitioning = ds.partitioning(pa.schema([("job", pa.string()), ("date", pa.string())]), flavor="hive")
        dataset = ds.dataset(root, format="parquet", partitioning=partitioning)
        # The first file's schema would hide columns that only newer files have.
        schema = pa.unify_schemas([dataset.schema, *(f.physical_schema for f in dataset.get_fragments())])
        dataset = ds.dataset(root, format="parquet", partitioning=partitioning, schema=schema)
        table = dataset.to_table(filter=ds.field("job") == job) if job is not None else dataset.to_table()
        names = table.column_names  # decoded here: a corrupt schema fails now, not later
    except (OSError, pa.ArrowException, UnicodeError) as exc:
        raise AttributionError(f"step store {root}: cannot be read ({exc}); is it an aggregator store_dir?") from None
    missing = [c for c in (*STEP_COLUMNS, "late") if c not in names and c not in OPTIONAL_COLUMNS]
    if missing:
        raise AttributionError(f"step store {root}: rows lack column(s) {', '.join(missing)}; written by an "
                               "aggregator of another version?")
    if table.num_rows == 0:
        where = f"job {job!r}" if job is not None else "any job"
        raise AttributionError(f"step store {root}: no rows of {where}; check --job and the store_dir")
    try:
        steps = table.to_pandas()
    except (pa.ArrowException, UnicodeError) as exc:  # invalid UTF-8 in a text column fails only here
        raise AttributionError(f"step store {root}: holds values that cannot be decoded ({exc}); a part file is "
                               "corrupt: move it out of the store") from None
    steps = steps.sort_values(["job", "step", "rank"], kind="stable").reset_index(drop=True)
    steps["flags"] = [tuple(f) if f is not None else () for f in steps["flags"]]
    phase = steps["phase_s"] if "phase_s" in steps else [None] * len(steps)
    steps["phase_s"] = [dict(p) if p is not None else {} for p in phase]
    steps["job"] = steps["job"].astype(str)
    taken = steps[~steps["late"].astype(bool)].copy()
    # Unknown idle (a rank without GPU samples) counts as 0, as the aggregator counted it; rows
    # without a step time (a part file missing the column) cannot be ranked.
    waits = taken[["idle_s", "exposed_comm_s", "straggler_wait_s"]].fillna(0.0).sum(axis=1)
    taken["compute_s"] = taken["step_time_s"] - waits
    taken = taken[taken["compute_s"].notna()]
    return Attribution(steps[list(STEP_COLUMNS)], straggler.slowest_ranks(taken), [])
