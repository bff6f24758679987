"""Read and write a recorded run: a directory of ``devices``, ``samples`` and ``markers`` tables.

Layout (DESIGN "A recorded run")::

    run/
      devices.parquet   (or devices.csv)   columns: chopper.schema.DEVICE_COLUMNS
      samples.parquet   (or samples.csv)   columns: chopper.schema.SAMPLE_COLUMNS
      markers.parquet   (or markers.csv)   columns: chopper.schema.MARKER_COLUMNS
      collectives.parquet (or .csv), optional   columns: COLLECTIVE_COLUMNS
      links.parquet (or .csv), optional         columns: chopper.schema.LINK_COLUMNS
      errors.parquet (or .csv), optional        columns: chopper.schema.ERROR_COLUMNS

``collectives`` holds the NCCL / RCCL Inspector's collective records the agent sent
(``chopper.v1.CollectiveRecord``, one row each, the same fields); a run without the table (one
recorded before it existed, or from a node without the Inspector) reads as an empty one.
``links`` holds the samples' per-link NVLink / XGMI counters (``Sample.links``), one row per
sample and link, keyed by the sample's ``ts_ns``, ``node`` and ``gpu``; a run without it (older,
or from a backend that reads no per-link counter) reads as an empty one, and its samples' summed
``link_tx_bytes``/``link_rx_bytes`` are all it has. ``errors`` holds the samples' health and
error counters (``Sample.errors``, docs/HEALTH.md), one row per sample and counter, keyed the same
way; a run without it reads as one whose GPUs reported none.

Columns added to a table after runs were first recorded (``ADDED_COLUMNS``: a device's PCI bus id
and partition, a sample's memory and regulator temperatures) may be missing from an older run's
file; they read as their "not read" value.

Parquet and CSV are accepted on input (Parquet wins when a directory holds both); ``write_run``
always writes Parquet. Units are the data model's: integer nanoseconds, MHz, watts, joules,
bytes, 0–1 ratios, cumulative throttle seconds.

Reading validates, in this order, and stops at the first problem with a ``RunDirError`` that
names it and says how to fix it:

1. the directory exists;
2. each table file exists and can be parsed;
3. each table has exactly the schema's columns (missing and extra ones are named);
4. each column has the right type: integer columns (``ts_ns``, ``gpu``, ...) hold whole numbers,
   float columns hold numbers or empty cells (NaN), text columns are text;
5. marker ``kind`` is a known kind, given either as its label (``step_begin``) or its integer
   wire value (``1``); it is normalised to the label;
6. every value lies in its column's range (:data:`BOUNDS`): ratios in [0, 1], counters, clocks,
   powers and FLOPs not negative, no infinity anywhere, device indices and timestamps that could
   be what they name (a column swapped with another fails here); NaN stays allowed in float
   columns (a value the backend could not read);
7. ``devices`` holds one row per ``(node, gpu)``;
8. every ``(node, gpu)`` that has samples has a row in ``devices``;
9. no collective ends before it begins;
10. every ``links`` row belongs to a sample (same ``ts_ns``, ``node``, ``gpu``) and names each
    link of that sample once;
11. every ``errors`` row belongs to a sample, names a kind of ``chopper.schema.ERROR_KINDS`` and
    each (kind, window, detail) of that sample once.

Each error names the file, the column, the first offending row (0-based, in file order, after a
CSV header) and the fix.

pandas and pyarrow are imported inside the functions, because ``import chopper`` must stay light.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chopper.schema import (
    DEVICE_COLUMNS,
    ERROR_COLUMNS,
    ERROR_KINDS,
    LINK_COLUMNS,
    MARKER_COLUMNS,
    MAX_LINKS,
    SAMPLE_COLUMNS,
    MarkerKind,
)

if TYPE_CHECKING:
    import pandas as pd

TABLES: tuple[str, ...] = ("devices", "samples", "markers")
# Tables a run may lack; each then reads as empty.
OPTIONAL_TABLES: tuple[str, ...] = ("collectives", "links", "errors")
# The fields of chopper.v1.CollectiveRecord, in field order (tests check that they agree).
COLLECTIVE_COLUMNS: tuple[str, ...] = (
    "job", "node", "rank", "gpu", "collective", "begin_ns", "end_ns", "placed", "exec_s", "timing_source", "bytes",
    "algo_bandwidth_gbs", "bus_bandwidth_gbs", "comm_id", "comm_rank", "comm_ranks", "comm_nodes", "seq", "pid",
    "format_version",
)
COLUMNS: dict[str, tuple[str, ...]] = {
    "devices": DEVICE_COLUMNS,
    "samples": SAMPLE_COLUMNS,
    "markers": MARKER_COLUMNS,
    "collectives": COLLECTIVE_COLUMNS,
    "links": LINK_COLUMNS,
    "errors": ERROR_COLUMNS,
}
# Columns a table gained after runs were first recorded -> the value an older file's rows read as
# (the field's "not read" default in chopper.schema).
ADDED_COLUMNS: dict[str, dict[str, Any]] = {
    "devices": {"pci_bus_id": "", "partition": "", "memory_partition": "", "chip_uuid": "", "compute_share": 1.0},
    "samples": {"mem_temp_c": math.nan, "vr_temp_c": math.nan},
}

# Column types per table. Anything not listed as int or str is float64 (NaN allowed).
_INT_COLUMNS: dict[str, frozenset[str]] = {
    "devices": frozenset({"gpu", "memory_bytes"}),
    "samples": frozenset({"ts_ns", "gpu"}),
    "markers": frozenset({"ts_ns", "rank", "gpu", "step"}),
    "collectives": frozenset({"rank", "gpu", "begin_ns", "end_ns", "bytes", "comm_rank", "comm_ranks", "comm_nodes",
                              "seq", "pid"}),
    "links": frozenset({"ts_ns", "gpu", "link"}),
    "errors": frozenset({"ts_ns", "gpu"}),
}
_STR_COLUMNS: dict[str, frozenset[str]] = {
    "devices": frozenset({"node", "vendor", "model", "uuid", "pci_bus_id", "partition", "memory_partition",
                          "chip_uuid"}),
    "samples": frozenset({"node"}),
    "markers": frozenset({"job", "node", "name", "kind"}),
    "collectives": frozenset({"job", "node", "collective", "timing_source", "comm_id", "format_version"}),
    "links": frozenset({"node"}),
    "errors": frozenset({"node", "kind", "window", "detail"}),
}
# True/false columns: booleans, 0/1 or the words true/false.
_BOOL_COLUMNS: dict[str, frozenset[str]] = {"collectives": frozenset({"placed"}), "errors": frozenset({"chip_wide"})}
_BOOL_BY_TEXT = {"true": True, "1": True, "1.0": True, "false": False, "0": False, "0.0": False}
_KIND_BY_TEXT: dict[str, str] = {}
for _k in MarkerKind:
    _KIND_BY_TEXT[_k.label] = _k.label
    _KIND_BY_TEXT[str(int(_k))] = _k.label
KIND_LABELS: tuple[str, ...] = tuple(k.label for k in MarkerKind)

# Highest local GPU index a node can have, plus one: a larger "gpu" is another column's value.
MAX_GPU = 1 << 16
# Averaged ratios land a rounding error beyond 1 (1.0000000000000002); 1e-6 is far above that and far
# below any misread value.
_RATIO_SLACK = 1e-6
_RATIO = (-_RATIO_SLACK, 1.0 + _RATIO_SLACK, "a ratio from 0 to 1")
_AMOUNT = (0.0, math.inf, "a finite amount, not negative")
_POSITIVE = (math.ulp(0.0), math.inf, "finite and above 0")
_INDEX = (0, MAX_GPU - 1, f"a local GPU index from 0 to {MAX_GPU - 1}")
_TIME = (0, 2**63 - 1, "nanoseconds, not negative")
_COUNT = (0, 2**63 - 1, "a whole number, not negative")
_ANY = (-math.inf, math.inf, "a finite number")
# (lowest, highest, what it must be) per column, inclusive; float columns also refuse ±inf (NaN is
# "not read" and always allowed). A column not listed accepts any value of its type.
BOUNDS: dict[str, dict[str, tuple[float, float, str]]] = {
    "devices": {
        "gpu": _INDEX, "max_gfx_clock_mhz": _POSITIVE, "peak_flops": _POSITIVE, "memory_bytes": _AMOUNT,
        "power_cap_w": _AMOUNT, "compute_share": (math.ulp(0.0), 1.0, "a share of the chip above 0, at most 1"),
    },
    "samples": {
        "ts_ns": _TIME, "gpu": _INDEX, "busy_ratio": _RATIO, "matrix_ratio": _RATIO, "mem_busy_ratio": _RATIO,
        "temp_c": _ANY, "mem_temp_c": _ANY, "vr_temp_c": _ANY,
        **{c: _AMOUNT for c in SAMPLE_COLUMNS if c.endswith(("_mhz", "_w", "_j", "_bytes", "_s"))},
    },
    "markers": {
        "ts_ns": _TIME, "rank": (0, 2**63 - 1, "a rank, not negative"), "step": (0, 2**63 - 1, "a step, not negative"),
        # -1: the agent could not place the rank's GPU (its steps are flagged unknown_device).
        "gpu": (-1, MAX_GPU - 1, f"a local GPU index from 0 to {MAX_GPU - 1}, or -1 (unknown device)"),
        "flops": _AMOUNT, "tokens": _AMOUNT, "bytes": _AMOUNT,
    },
    "collectives": {
        # -1: the agent could not tell the rank or the GPU of the process (docs/INSPECTOR.md).
        "rank": (-1, 2**31 - 1, "a rank, or -1 (unknown)"),
        "gpu": (-1, MAX_GPU - 1, f"a local GPU index from 0 to {MAX_GPU - 1}, or -1 (unknown device)"),
        "begin_ns": _TIME, "end_ns": _TIME, "exec_s": _AMOUNT, "bytes": _COUNT, "algo_bandwidth_gbs": _AMOUNT,
        "bus_bandwidth_gbs": _AMOUNT, "comm_rank": (-1, 2**31 - 1, "a rank in the communicator, or -1 (unknown)"),
        "comm_ranks": (0, 2**32 - 1, "a number of ranks, not negative"),
        "comm_nodes": (0, 2**32 - 1, "a number of nodes, not negative"), "seq": _COUNT, "pid": _COUNT,
    },
    "links": {
        "ts_ns": _TIME, "gpu": _INDEX, "link": (0, MAX_LINKS - 1, f"a link index from 0 to {MAX_LINKS - 1}"),
        "tx_bytes": _AMOUNT, "rx_bytes": _AMOUNT,
    },
    "errors": {"ts_ns": _TIME, "gpu": _INDEX, "value": _AMOUNT},
}


class RunDirError(ValueError):
    """A recorded run directory is missing, incomplete or malformed; the message says how to fix it."""


@dataclass(frozen=True)
class RecordedRun:
    """The three tables of a recorded run, validated and typed.

    Attributes:
        path: The run directory.
        devices: One row per GPU, columns ``DEVICE_COLUMNS``.
        samples: One row per GPU per tick, columns ``SAMPLE_COLUMNS``, sorted by ``ts_ns``
            (stable, so rows with equal timestamps keep file order).
        markers: One row per event, columns ``MARKER_COLUMNS``, sorted by ``ts_ns`` (stable);
            ``kind`` holds the lower-case labels (``step_begin`` ...).
        collectives: One row per Inspector collective record, columns ``COLLECTIVE_COLUMNS``,
            sorted by ``begin_ns`` (stable); empty when the run has no such table.
        links: One row per sample and NVLink / XGMI link, columns ``LINK_COLUMNS``, sorted by
            ``ts_ns`` then ``link`` (stable); empty when the run has no such table.
        errors: One row per sample and health counter, columns ``ERROR_COLUMNS``, sorted by
            ``ts_ns`` (stable); empty when the run has no such table.
    """

    path: Path
    devices: pd.DataFrame
    samples: pd.DataFrame
    markers: pd.DataFrame
    collectives: pd.DataFrame
    links: pd.DataFrame
    errors: pd.DataFrame


def table_files(path: str | Path, table: str) -> tuple[Path, Path]:
    """Return the two accepted file names of ``table`` in ``path``: Parquet first, then CSV."""
    base = Path(path)
    return base / f"{table}.parquet", base / f"{table}.csv"


def read_run(path: str | Path) -> RecordedRun:
    """Read and validate a recorded run directory.

    Args:
        path: Directory holding ``devices``, ``samples`` and ``markers`` as ``.parquet`` or
            ``.csv``, and optionally ``collectives``.

    Returns:
        The validated run; see ``RecordedRun`` for column types and ordering.

    Raises:
        RunDirError: The directory, a table, a column or a value is wrong; the message names
            which and how to fix it.
    """
    base = Path(path)
    if not base.exists():
        raise RunDirError(f"recorded run directory {str(base)!r} does not exist; pass the directory "
                          "that holds devices/samples/markers (.parquet or .csv)")
    if not base.is_dir():
        raise RunDirError(f"recorded run {str(base)!r} is a file, not a directory; pass the directory "
                          "that holds devices/samples/markers (.parquet or .csv)")
    frames = {table: _read_table(base, table) for table in TABLES}
    frames.update({table: _read_table(base, table) if any(f.exists() for f in table_files(base, table))
                   else _empty(table) for table in OPTIONAL_TABLES})
    for table, frame in frames.items():
        _check_bounds(table, frame, _source(base, table))
    _check_one_row_per_device(frames["devices"], _source(base, "devices"))
    _check_sample_gpus(frames["devices"], frames["samples"])
    _check_collective_order(frames["collectives"], _source(base, "collectives"))
    _check_links(frames["samples"], frames["links"], _source(base, "links"))
    _check_errors(frames["samples"], frames["errors"], _source(base, "errors"))
    return RecordedRun(
        path=base,
        devices=frames["devices"],
        samples=frames["samples"].sort_values("ts_ns", kind="stable", ignore_index=True),
        markers=frames["markers"].sort_values("ts_ns", kind="stable", ignore_index=True),
        collectives=frames["collectives"].sort_values("begin_ns", kind="stable", ignore_index=True),
        links=frames["links"].sort_values(["ts_ns", "link"], kind="stable", ignore_index=True),
        errors=frames["errors"].sort_values("ts_ns", kind="stable", ignore_index=True),
    )


def write_run(
    path: str | Path,
    devices: pd.DataFrame | Sequence[Any],
    samples: pd.DataFrame | Sequence[Any],
    markers: pd.DataFrame | Sequence[Any],
    collectives: pd.DataFrame | Sequence[Any] | None = None,
    links: pd.DataFrame | Sequence[Any] | None = None,
    errors: pd.DataFrame | Sequence[Any] | None = None,
) -> Path:
    """Validate and write a recorded run as Parquet (``devices.parquet`` ...).

    Args:
        path: Target directory; created with its parents if missing. Existing table files of the
            same names are replaced (a stale CSV next to them is removed so it cannot shadow or
            contradict the new run).
        devices: DataFrame, or a sequence of ``DeviceInfo`` / dataclasses / mappings with the
            device columns.
        samples: Same for ``Sample`` rows.
        markers: Same for marker rows; ``kind`` may be a ``MarkerKind``, its label or its value.
        collectives: Same for Inspector collective rows (``COLLECTIVE_COLUMNS``); None writes no
            ``collectives`` table and removes one left from an earlier run in ``path``.
        links: Per-link rows (``LINK_COLUMNS``). None takes them from ``Sample`` rows' ``links``
            when ``samples`` is a sequence of them; without any, no ``links`` table is written
            (and one left from an earlier run is removed).
        errors: Health counter rows (``ERROR_COLUMNS``), taken from ``Sample`` rows' ``errors`` the
            same way when None.

    Returns:
        The run directory.

    Raises:
        RunDirError: The data does not fit the schema (same checks as ``read_run``).
    """
    base = Path(path)
    given = {"devices": devices, "samples": samples, "markers": markers}
    if collectives is not None:
        given["collectives"] = collectives
    if links is None:
        links = _per_sample_rows(samples, "links", LINK_COLUMNS)
    if links is not None:
        given["links"] = links
    if errors is None:
        errors = _per_sample_rows(samples, "errors", ERROR_COLUMNS)
    if errors is not None:
        given["errors"] = errors
    frames = {table: _normalise(table, _to_frame(table, rows), source=f"{table} (argument)")
              for table, rows in given.items()}
    _check_sample_gpus(frames["devices"], frames["samples"])
    if "collectives" in frames:
        _check_collective_order(frames["collectives"], "collectives (argument)")
    if "links" in frames:
        _check_links(frames["samples"], frames["links"], "links (argument)")
    if "errors" in frames:
        _check_errors(frames["samples"], frames["errors"], "errors (argument)")
    base.mkdir(parents=True, exist_ok=True)
    for table in (*TABLES, *OPTIONAL_TABLES):
        parquet, csv = table_files(base, table)
        if table in frames:
            frames[table].to_parquet(parquet, index=False)
        else:
            parquet.unlink(missing_ok=True)
        csv.unlink(missing_ok=True)
    return base


def _per_sample_rows(samples: pd.DataFrame | Sequence[Any], field: str,
                     columns: tuple[str, ...]) -> pd.DataFrame | None:
    """The rows of ``Sample`` objects' tuple ``field`` (links, errors), each keyed by its sample's
    ts_ns, node and gpu; None for a frame or samples without any."""
    import pandas as pd

    if isinstance(samples, pd.DataFrame):
        return None
    rows = [(s.ts_ns, s.node, s.gpu, *k) for s in samples for k in getattr(s, field, ())]
    return pd.DataFrame(rows, columns=list(columns)) if rows else None


_SAMPLE_KEY = ["ts_ns", "node", "gpu"]


def _check_owned(samples: pd.DataFrame, rows: pd.DataFrame, table: str, source: str) -> None:
    """Refuse a row of a per-sample table that no sample has (ts_ns, node, gpu)."""
    import pandas as pd

    owned = pd.MultiIndex.from_frame(rows[_SAMPLE_KEY]).isin(pd.MultiIndex.from_frame(samples[_SAMPLE_KEY]))
    if not owned.all():
        row = int((~owned).argmax())
        r = rows.iloc[row]
        raise RunDirError(
            f"{source}: row {row} (ts_ns={int(r['ts_ns'])}, node={r['node']}, gpu={int(r['gpu'])}) belongs to no "
            f"sample; {int((~owned).sum())} such row(s). Each {table} row carries a sample's ts_ns, node and gpu: "
            f"re-export the {table} table together with the samples table")


def _check_links(samples: pd.DataFrame, links: pd.DataFrame, source: str) -> None:
    """Refuse a links row that no sample has (ts_ns, node, gpu), or one link twice in a sample."""
    if links.empty:
        return
    _check_owned(samples, links, "links", source)
    repeated = links.duplicated([*_SAMPLE_KEY, "link"])
    if repeated.any():
        row = int(repeated.argmax())
        r = links.iloc[row]
        raise RunDirError(
            f"{source}: row {row} repeats link {int(r['link'])} of the sample at ts_ns={int(r['ts_ns'])} "
            f"node={r['node']} gpu={int(r['gpu'])}; a sample has one row per link: remove the duplicate rows")


def _check_errors(samples: pd.DataFrame, errors: pd.DataFrame, source: str) -> None:
    """Refuse an errors row of an unknown kind, one no sample has, or one counter twice in a sample."""
    if errors.empty:
        return
    unknown = ~errors["kind"].isin(list(ERROR_KINDS))
    if unknown.any():
        row = int(unknown.argmax())
        raise RunDirError(f"{source}: row {row} has unknown kind {errors['kind'].iloc[row]!r}; use one of "
                          f"{', '.join(ERROR_KINDS)} (chopper.schema.ERROR_KINDS, docs/HEALTH.md)")
    _check_owned(samples, errors, "errors", source)
    repeated = errors.duplicated([*_SAMPLE_KEY, "kind", "window", "detail"])
    if repeated.any():
        row = int(repeated.argmax())
        r = errors.iloc[row]
        raise RunDirError(
            f"{source}: row {row} repeats counter kind={r['kind']} window={r['window']!r} detail={r['detail']!r} of "
            f"the sample at ts_ns={int(r['ts_ns'])} node={r['node']} gpu={int(r['gpu'])}; a sample has one row per "
            "counter: remove the duplicate rows")


def _empty(table: str) -> pd.DataFrame:
    """The table with its columns and types and no rows."""
    return _normalise(table, _to_frame(table, []), source=f"{table} (empty)")


def _source(base: Path, table: str) -> str:
    parquet, csv = table_files(base, table)
    return str(parquet if parquet.exists() else csv)


def _read_table(base: Path, table: str) -> pd.DataFrame:
    """One table of a run directory, loaded and normalised."""
    import pyarrow as pa

    frame, source = _load(base, table), _source(base, table)
    try:
        return _normalise(table, frame, source=source)
    except (pa.ArrowException, UnicodeError) as exc:  # corrupt text (invalid UTF-8) fails only when converted
        raise RunDirError(f"{source}: holds text that cannot be decoded ({type(exc).__name__}: {exc}); the file is "
                          f"corrupt: re-export the {table} table") from exc


def _load(base: Path, table: str) -> pd.DataFrame:
    import pandas as pd

    parquet, csv = table_files(base, table)
    if parquet.exists():
        file = parquet
        try:
            return pd.read_parquet(parquet)
        except Exception as exc:  # pyarrow raises several unrelated types for bad files
            err: Exception = exc
    elif csv.exists():
        file = csv
        try:
            # Text columns stay text (a node named "001" must not become the integer 1).
            dtypes = {c: "str" for c in _STR_COLUMNS[table]}
            frame = pd.read_csv(csv, dtype=dtypes, keep_default_na=True)
        except Exception as exc:
            err = exc
        else:
            # More cells than header names make pandas take the first ones as an index, shifting
            # every value into the wrong column.
            if not isinstance(frame.index, pd.RangeIndex):
                raise RunDirError(f"{str(csv)!r}: rows have more cells than the header has column names; "
                                  f"re-export the {table} table with one header name per column")
            return frame
    else:
        raise RunDirError(f"recorded run {str(base)!r} has no {table} table: expected "
                          f"{parquet.name} or {csv.name} in that directory")
    raise RunDirError(f"cannot read {str(file)!r} ({type(err).__name__}: {err}); the file is unreadable "
                      f"or corrupt: re-export the {table} table") from err


_PER_SAMPLE_TABLES = ("links", "errors")


def _to_frame(table: str, rows: Any) -> pd.DataFrame:
    import pandas as pd

    if isinstance(rows, pd.DataFrame):
        return rows.copy()
    records: list[Mapping[str, Any]] = []
    for row in rows:
        if dataclasses.is_dataclass(row) and not isinstance(row, type):
            # Sample.links and Sample.errors are tables of their own, not columns of the samples table.
            records.append({f.name: getattr(row, f.name) for f in dataclasses.fields(row)
                            if f.name not in _PER_SAMPLE_TABLES})
        elif isinstance(row, Mapping):
            records.append(row)
        else:
            raise RunDirError(f"{table}: rows must be dataclasses or mappings, got {type(row).__name__}")
    if not records:
        return pd.DataFrame({c: [] for c in COLUMNS[table]})
    return pd.DataFrame.from_records(records)


def _normalise(table: str, frame: pd.DataFrame, source: str) -> pd.DataFrame:
    """Check columns and types of one table and return it with canonical dtypes and order."""
    import numpy as np
    import pandas as pd

    expected = COLUMNS[table]
    present = [str(c) for c in frame.columns]
    for col, default in ADDED_COLUMNS.get(table, {}).items():
        if col not in present:
            frame[col] = default
            present.append(col)
    missing = [c for c in expected if c not in present]
    extra = [c for c in present if c not in expected]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing column(s) {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected column(s) {', '.join(extra)}")
        raise RunDirError(f"{source}: {'; '.join(parts)}; the {table} table must have exactly the "
                          f"columns {', '.join(expected)} (see chopper.schema)")
    out: dict[str, Any] = {}
    for col in expected:
        values = frame[col]
        if col == "kind" and table == "markers":
            out[col] = _kinds(values, source)
        elif col in _BOOL_COLUMNS.get(table, ()):
            out[col] = _bools(values, col, source)
        elif col in _STR_COLUMNS[table]:
            out[col] = values.astype(object).where(values.notna(), "").map(str).astype(str)
        else:
            numeric = pd.to_numeric(values, errors="coerce")
            # Empty cells become NaN: legitimate in float columns, reported below for int ones.
            bad = numeric.isna() & values.notna() & values.astype(str).str.strip().ne("")
            if bad.any():
                example = values[bad].iloc[0]
                raise RunDirError(f"{source}: column {col} has non-numeric value {example!r} "
                                  f"(row {int(np.flatnonzero(bad.to_numpy())[0])}); it must hold numbers")
            if col in _INT_COLUMNS[table]:
                out[col] = pd.Series(_int64(numeric, col, source), index=frame.index)
            else:
                out[col] = numeric.astype(np.float64)
    return pd.DataFrame(out, columns=list(expected)).reset_index(drop=True)


def _int64(numeric: pd.Series, col: str, source: str) -> Any:
    """An integer column as int64, or a ``RunDirError`` naming the first value that is not a whole
    number in int64 range (a uint64 above 2**63, a float such as 1e20 or inf, an empty cell)."""
    import numpy as np

    # Integers go straight through: ts_ns (~1.7e18) does not survive a float64 trip.
    if numeric.dtype.kind in "iu" and not numeric.hasnans:
        if numeric.dtype.kind == "i" or not len(numeric) or numeric.max() < 2**63:
            return numeric.to_numpy(dtype=np.int64)
        arr = numeric.to_numpy(dtype=float)
    else:
        arr = numeric.to_numpy(dtype=float, na_value=np.nan)
    # Every float below 2**63 in magnitude converts exactly; 2**63 itself does not fit.
    whole = np.isfinite(arr) & (arr == np.round(arr)) & (np.abs(arr) < 2.0**63)
    if not whole.all():
        row = int(np.flatnonzero(~whole)[0])
        raise RunDirError(f"{source}: column {col} must hold whole numbers (integer "
                          f"{'nanoseconds' if col == 'ts_ns' else 'values'}) within 64 bits, with no "
                          f"empty cells; row {row} has {float(arr[row])!r}")
    return arr.astype(np.int64)


def _kinds(values: pd.Series, source: str) -> pd.Series:
    import pandas as pd

    def label(v: Any) -> str | None:
        if isinstance(v, MarkerKind):
            return v.label
        if isinstance(v, float) and math.isfinite(v) and v == int(v):
            v = int(v)
        return _KIND_BY_TEXT.get(str(v).strip().lower())

    labels = [label(v) for v in values]
    for v, lab in zip(values, labels, strict=True):
        if lab is None:
            raise RunDirError(f"{source}: unknown marker kind {v!r}; use one of {', '.join(KIND_LABELS)} "
                              f"or their integer values 1–{len(KIND_LABELS)}")
    return pd.Series(labels, index=values.index, dtype=str)


def _bools(values: pd.Series, col: str, source: str) -> pd.Series:
    """A true/false column as bool, or a ``RunDirError`` naming the first value that is neither."""
    import pandas as pd

    if values.dtype == bool:
        return values.astype(bool)
    parsed = [_BOOL_BY_TEXT.get(str(v).strip().lower()) for v in values]
    for row, (v, b) in enumerate(zip(values, parsed, strict=True)):
        if b is None:
            raise RunDirError(f"{source}: column {col} must be true or false (or 1/0); row {row} has {v!r}")
    return pd.Series(parsed, index=values.index, dtype=bool)


def _check_collective_order(collectives: pd.DataFrame, source: str) -> None:
    """Refuse a collective whose end lies before its begin (the two columns were swapped, or the clocks)."""
    import numpy as np

    backwards = np.flatnonzero(collectives["end_ns"].to_numpy() < collectives["begin_ns"].to_numpy())
    if backwards.size:
        row = int(backwards[0])
        raise RunDirError(
            f"{source}: row {row} ends before it begins (begin_ns={int(collectives['begin_ns'].iloc[row])}, "
            f"end_ns={int(collectives['end_ns'].iloc[row])}; {backwards.size} such row(s)); a collective's "
            "end_ns must be at or after its begin_ns: fix those rows or re-export the collectives table")


def _check_sample_gpus(devices: pd.DataFrame, samples: pd.DataFrame) -> None:
    known = set(zip(devices["node"], devices["gpu"].tolist(), strict=True))
    seen = set(zip(samples["node"], samples["gpu"].tolist(), strict=True))
    unknown = sorted(seen - known)
    if unknown:
        shown = ", ".join(f"node={n} gpu={g}" for n, g in unknown[:5])
        raise RunDirError(f"samples refer to GPU(s) not in the devices table: {shown}; add a devices row "
                          "for each (node, gpu) that has samples")


def _check_bounds(table: str, frame: pd.DataFrame, source: str) -> None:
    """Refuse the first value outside its column's :data:`BOUNDS` (infinity in any float column)."""
    import numpy as np

    for col in COLUMNS[table]:
        lo, hi, what = BOUNDS[table].get(col, _ANY)
        values = frame[col].to_numpy()
        if values.dtype.kind not in "if":
            continue
        if values.dtype.kind == "f":
            bad = ~np.isnan(values) & ((values < lo) | (values > hi) | np.isinf(values))
        else:
            bad = (values < lo) | (values > hi)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            value = values[row].item()
            empty = ", or empty where unknown" if values.dtype.kind == "f" else ""
            count = int(bad.sum())
            raise RunDirError(
                f"{source}: column {col} must be {what}{empty}; row {row} has {value!r} ({count} "
                f"row{'s' if count > 1 else ''} outside that range). Fix that row or re-export the {table} "
                "table; a column holding another column's values means the two were swapped (see chopper.schema "
                "for the order)")


def _check_one_row_per_device(devices: pd.DataFrame, source: str) -> None:
    """Refuse a devices table that lists one ``(node, gpu)`` twice: which row describes it?"""
    repeated = devices.duplicated(["node", "gpu"], keep=False)
    if repeated.any():
        first = devices[repeated].iloc[0]
        rows = devices.index[repeated & (devices["node"] == first["node"]) & (devices["gpu"] == first["gpu"])]
        raise RunDirError(
            f"{source}: node={first['node']} gpu={int(first['gpu'])} is listed in rows "
            f"{', '.join(map(str, rows.tolist()))} (columns node, gpu); a run has one devices row per GPU: "
            "remove the duplicate rows (runs of two nodes that share a name need distinct node names)")
