"""Streamed, vectorized reader of Kineto / PyTorch-profiler JSON traces (CUDA and ROCm).

A multi-GB trace is never held as Python event dicts: ``ijson`` (C backend when present) yields
one event at a time, the reader keeps only the fields the analyses need in typed ``array``
columns (8 bytes a value), interns repeated names, and builds the numpy columns of
:mod:`chopper.trace.frames` once at the end. pandas is imported only when a caller first asks
for a frame as a DataFrame (``Trace.kernels`` and siblings).
"""
from __future__ import annotations

import gzip
import json
import re
import zlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import ijson as _ijson
import numpy as np
from ijson.common import IncompleteJSONError, JSONError

from chopper.trace.frames import (
    CPU_OP_COLUMNS,
    FLOW_COLUMNS,
    GPU_ANNOTATION_COLUMNS,
    KERNEL_COLUMNS,
    RUNTIME_COLUMNS,
    Columns,
)
from chopper.trace.nesting import NestingGuard, Readable, TooDeep
from chopper.trace.timestamps import MAX_NS, MAX_US, US_NS, hta_rounds, kineto_time_ns
from chopper.trace.toplevel import HeadError, split_head

if TYPE_CHECKING:
    import pandas as pd

try:  # the C backend is ~10x faster than the pure-Python one; fall back to whatever ijson picked
    ijson: Any = _ijson.get_backend("yajl2_c")
except ImportError:  # pragma: no cover - depends on the wheel
    ijson = _ijson

KERNEL_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
SYNC_CATS = frozenset({"cuda_sync"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "Runtime", "Driver"})
CPU_OP_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "Operator"})
GPU_ANNOTATION_CATS = frozenset({"gpu_user_annotation"})
FLOW_CATS = frozenset({"fwdbwd", "ac2g"})
FLOW_PHASES = frozenset({"s", "f", "t"})

_TAIL_BYTES = 1 << 16
# Events read between moves of the frames' rows into their typed arrays (_Columns.flush).
_FLUSH_EVERY = 1 << 14
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


class TraceError(ValueError):
    """A trace file that cannot be analyzed; the message names the file and the fix."""


@dataclass
class Trace:
    """One rank's parsed trace.

    The frames are held as numpy :class:`~chopper.trace.frames.Columns` (``*_columns``); the
    same-named properties without the suffix (``kernels``, ``runtime``, ...) build the pandas
    DataFrame of each on first use and keep it, so one trace hands out one DataFrame per frame.

    Attributes:
        path: The file it was read from.
        rank: ``distributedInfo.rank``, else ``rank<N>`` in the file name, else 0.
        world_size: ``distributedInfo.world_size``, or None when the trace does not say.
        device_type: ``"cuda"`` or ``"rocm"``.
        kernel_columns: GPU kernels, memcpys and memsets (``frames.KERNEL_COLUMNS``).
        runtime_columns: CUDA/HIP runtime and driver calls (``frames.RUNTIME_COLUMNS``).
        cpu_op_columns: CPU ranges: cpu_op, user_annotation, python_function (``frames.CPU_OP_COLUMNS``).
        gpu_annotation_columns: ``gpu_user_annotation`` ranges (``frames.GPU_ANNOTATION_COLUMNS``).
        flow_columns: flow endpoints, fwdbwd and ac2g (``frames.FLOW_COLUMNS``).
        gpu_sync_columns: ``cuda_sync`` events on the GPU timeline (``frames.KERNEL_COLUMNS``); not
            kernels, but counted as GPU activity by Holistic Trace Analysis.
        clock_offset_ns: What was added to every Kineto time to put it on CLOCK_REALTIME
            (:func:`clock_offset_ns`), so frames, markers and samples share one time axis.
        fractional_ts: True when HTA rounds this trace's times to whole µs: some event writes its
            ``ts`` as a float (ns resolution, newer Kineto) or has none
            (:func:`chopper.trace.timestamps.hta_rounds`).
        cpu_stream_events: Events off the GPU timeline (CPU ops, runtime calls, annotations) that
            carry a ``stream`` argument: HTA counts them as GPU kernels, Chopper does not.
        metadata: Top-level keys other than ``traceEvents`` (distributedInfo, deviceProperties,
            baseTimeNanoseconds, traceName, ...).
        warnings: What the reader could not link, and which analyses lose what because of it.
    """

    path: Path
    rank: int
    world_size: int | None
    device_type: str
    kernel_columns: Columns
    runtime_columns: Columns
    cpu_op_columns: Columns
    gpu_annotation_columns: Columns
    flow_columns: Columns
    gpu_sync_columns: Columns
    clock_offset_ns: int = 0
    fractional_ts: bool = False
    cpu_stream_events: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    # cached_property, not fields: dataclasses.replace() with new columns starts with no stale frames.
    @cached_property
    def kernels(self) -> pd.DataFrame:
        """``kernel_columns`` as a DataFrame."""
        return self.kernel_columns.to_pandas()

    @cached_property
    def runtime(self) -> pd.DataFrame:
        """``runtime_columns`` as a DataFrame."""
        return self.runtime_columns.to_pandas()

    @cached_property
    def cpu_ops(self) -> pd.DataFrame:
        """``cpu_op_columns`` as a DataFrame."""
        return self.cpu_op_columns.to_pandas()

    @cached_property
    def gpu_annotations(self) -> pd.DataFrame:
        """``gpu_annotation_columns`` as a DataFrame."""
        return self.gpu_annotation_columns.to_pandas()

    @cached_property
    def flows(self) -> pd.DataFrame:
        """``flow_columns`` as a DataFrame."""
        return self.flow_columns.to_pandas()

    @cached_property
    def gpu_syncs(self) -> pd.DataFrame:
        """``gpu_sync_columns`` as a DataFrame."""
        return self.gpu_sync_columns.to_pandas()


class _Interner:
    """Maps repeated strings to small ints so a column costs 4 bytes a row, not a str object."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}

    def encode(self, values: Iterable[Any]) -> list[int]:
        """The code of each value (None as "", another non-str as its ``str``), new ones numbered as first seen."""
        codes = self.codes
        # setdefault reads len(codes) before it inserts: a new string gets the next code.
        return [codes.setdefault(v if v.__class__ is str else _text(v), len(codes)) for v in values]

    def vocab(self) -> np.ndarray:
        """The strings by code; decoding indexes it, so a column shares one str object per name."""
        return np.array(list(self.codes), dtype=object)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


class _Columns:
    """Typed column buffers for one frame, filled a chunk of rows at a time.

    The event loop appends one tuple per event to ``rows`` (one call where a column each would
    cost seven); ``flush`` moves them into the typed arrays, text columns through their interner,
    so at most ``_FLUSH_EVERY`` events' rows are held as Python objects.

    Args:
        spec: Column name → ``array`` type code, in the order of a row's values.
        text: Column name → the interner of a text column (its type code is ``"i"``).
    """

    def __init__(self, spec: dict[str, str], text: dict[str, _Interner]) -> None:
        self.cols = {name: array(tc) for name, tc in spec.items()}
        self.text = text
        self.rows: list[tuple[Any, ...]] = []

    def flush(self) -> None:
        if not self.rows:
            return
        for (name, col), values in zip(self.cols.items(), zip(*self.rows, strict=True), strict=True):
            interner = self.text.get(name)
            col.extend(values if interner is None else interner.encode(values))
        self.rows.clear()

    def __len__(self) -> int:
        return len(next(iter(self.cols.values())))


def _to_int(v: Any, default: int = -1) -> int:
    """An id or index as an int64 (``default`` when it is no whole number within int64)."""
    if type(v) is int:  # the common case, called per event: first and alone
        return v if -(2**63) <= v < 2**63 else default
    if isinstance(v, int) and not isinstance(v, bool):
        out = v
    elif isinstance(v, float) and v.is_integer():
        out = int(v)
    elif isinstance(v, str):
        try:
            out = int(v, 0)
        except ValueError:
            return default
    else:
        return default
    return out if -(2**63) <= out < 2**63 else default


def _on_a_stream(v: Any) -> bool:
    """Whether HTA reads a ``stream`` argument as a stream: ``int(v)`` succeeds and is not -1."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        return False
    try:
        return int(v) != -1
    except (ValueError, OverflowError):  # "0x0" (ROCm runtime calls), NaN, inf: HTA's -1
        return False


class _TailKeeper:
    """File wrapper that remembers the last bytes read, to find metadata after ``traceEvents``."""

    def __init__(self, fh: Readable) -> None:
        self._fh = fh
        self.tail = b""

    def read(self, n: int = -1, /) -> bytes:
        data = self._fh.read(n)
        if data:
            self.tail = (self.tail + data)[-_TAIL_BYTES:]
        return data


def _open(path: Path) -> IO[bytes]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _bad(path: Path, what: str, fix: str) -> TraceError:
    return TraceError(f"{path}: {what}. {fix}")


class _Resumed:
    """A stream that first returns bytes already read from it (``pending``), then reads on."""

    def __init__(self, pending: bytes, fh: Readable) -> None:
        self._pending = pending
        self._fh = fh

    def read(self, n: int = -1, /) -> bytes:
        if not self._pending:
            return self._fh.read(n)
        cut = len(self._pending) if n < 0 else n  # ijson reads 0 bytes first, to learn the type
        data, self._pending = self._pending[:cut], self._pending[cut:]
        return data


_HEAD_FIXES = {
    "list": ("the JSON is a list, not a Kineto trace object",
             "Export the trace with torch.profiler (prof.export_chrome_trace or tensorboard_trace_handler)"),
    "no_events": ("no 'traceEvents' list: JSON that is not a Kineto / PyTorch-profiler trace",
                  "Pass a trace written by torch.profiler (a .json or .json.gz with a traceEvents list)"),
    "events_not_list": ("'traceEvents' is not a list", "The file is not a Kineto trace"),
}


def _head_error(path: Path, exc: HeadError) -> TraceError:
    if exc.kind in _HEAD_FIXES:
        return _bad(path, *_HEAD_FIXES[exc.kind])
    return _bad(path, f"not valid JSON or cut short ({exc})",
                "Pass a Kineto / PyTorch-profiler trace (.json or .json.gz), recorded or copied whole")


def _read_tail(tail: bytes) -> dict[str, Any]:
    """Top-level keys after the ``traceEvents`` array, from the last bytes of the stream.

    Algorithm:
        1. For each ``]`` in the tail, right to left, try to parse ``{`` + what follows its comma.
        2. Only the end of ``traceEvents`` leaves a text that closes exactly one object, so the
           leftmost success is the tail metadata (an inner ``]`` leaves unbalanced braces).
    """
    text = tail.decode("utf-8", errors="replace")
    found: dict[str, Any] = {}
    pos = len(text)
    for _ in range(400):  # bounded: tail keys are a handful of scalars
        pos = text.rfind("]", 0, pos)
        if pos < 0:
            break
        rest = text[pos + 1:].lstrip()
        if rest.startswith(","):
            try:
                obj = json.loads("{" + rest[1:])
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict):
                found = obj
    return found


def read_trace(path: str | Path, require_gpu: bool = True) -> Trace:
    """Read one Kineto trace file into frames.

    Algorithm:
        1. Bound the nesting of every byte read (:mod:`chopper.trace.nesting`) before a parser
           sees it, so that time and memory stay linear in the file's size whatever its shape.
        2. Read the top-level keys before ``traceEvents`` with ``json``, stopping at the event
           list (:mod:`chopper.trace.toplevel`); the event parser continues on the same stream.
        3. Stream ``traceEvents.item`` with ``ijson.items``; route each event by ``cat``/``ph`` into
           typed column buffers, keeping from ``args`` only correlation, External id, device and
           stream; intern names and categories.
        4. Parse top-level keys written after the events from the last 64 KiB of the stream.
        5. Build the frames (ts/dur µs → int64 ns by :func:`chopper.trace.timestamps.kineto_time_ns`,
           then ts moved onto CLOCK_REALTIME by :func:`clock_offset_ns`; end = ts + dur), detect
           rank, world size and device type, and record what cannot be linked in ``warnings``.

    Args:
        path: A ``.json`` or ``.json.gz`` trace.
        require_gpu: Refuse a trace without GPU kernels (a CPU-only profile), which the kernel-level
            analyses cannot use; False reads it with empty GPU frames (for its ``ProfilerStep`` ranges).

    Returns:
        The parsed :class:`Trace`.

    Raises:
        TraceError: missing or unreadable file, truncated gzip, not JSON, nested deeper than
            :data:`chopper.trace.nesting.MAX_DEPTH`, not a trace, no GPU kernels while ``require_gpu``.
    """
    path = Path(path)
    if not path.exists():
        raise _bad(path, "no such trace file", "Check the path (a .json or .json.gz written by torch.profiler)")
    if path.is_dir():
        raise _bad(path, "is a directory", "Pass the trace files inside it (load_traces) instead")
    try:
        meta, tail_meta, parsed = _read_stream(path)
    except TraceError:
        raise
    except TooDeep as exc:
        raise _bad(path, f"{exc} (Kineto writes fewer than 10)",
                   "The file is not a trace torch.profiler wrote; pass the trace itself") from exc
    except HeadError as exc:
        raise _head_error(path, exc) from exc
    except RecursionError as exc:  # pragma: no cover - the nesting bound comes first
        raise _bad(path, "JSON nested too deep", "Pass a trace torch.profiler wrote") from exc
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise _bad(path, f"truncated or corrupt gzip ({exc})",
                   "The file was cut short (copy interrupted or profiler killed); copy or record it again") from exc
    except IncompleteJSONError as exc:
        raise _bad(path, f"not valid JSON or cut short ({exc})",
                   "Record or copy the trace again; a partly written trace cannot be analyzed") from exc
    except JSONError as exc:
        raise _bad(path, f"not valid JSON ({exc})",
                   "Pass a Kineto / PyTorch-profiler trace (.json or .json.gz)") from exc
    except UnicodeDecodeError as exc:
        raise _bad(path, "not text JSON", "Pass a Kineto / PyTorch-profiler trace (.json or .json.gz)") from exc
    meta.update(tail_meta)
    return _assemble(path, meta, parsed, require_gpu)


def _read_stream(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """One pass over the file: head keys, events, tail keys (see :func:`read_trace`)."""
    names = _Interner()
    cats = _Interner()
    coded = {"name": names, "cat": cats}
    k = _Columns({"name": "i", "cat": "i", "ts": "q", "dur": "q", "device": "q", "stream": "q", "correlation": "q"},
                 coded)
    s = _Columns({"name": "i", "cat": "i", "ts": "q", "dur": "q", "device": "q", "stream": "q", "correlation": "q"},
                 coded)
    r = _Columns({"name": "i", "ts": "q", "dur": "q", "pid": "q", "tid": "q", "correlation": "q"}, coded)
    c = _Columns({"name": "i", "cat": "i", "ts": "q", "dur": "q", "pid": "q", "tid": "q", "external_id": "q"}, coded)
    g = _Columns({"name": "i", "ts": "q", "dur": "q", "device": "q", "stream": "q"}, coded)
    f = _Columns({"id": "q", "cat": "i", "phase": "i", "ts": "q", "pid": "q", "tid": "q"}, {"cat": cats, "phase": cats})
    frames = (k, s, r, c, g, f)
    kernel_row, sync_row, runtime_row, cpu_op_row = k.rows.append, s.rows.append, r.rows.append, c.rows.append
    annotation_row, flow_row = g.rows.append, f.rows.append
    fractional = False
    cpu_stream_events = 0
    kernels_without_corr = 0
    bad_times = 0
    with _open(path) as raw:
        guarded = NestingGuard(raw)
        head, rest = split_head(guarded)
        # The event parser sees the document from the '[' of traceEvents on, behind the key
        # it opens: the head keys are never parsed again.
        fh = _TailKeeper(_Resumed(b'{"traceEvents":[' + rest, guarded))
        # Per event, ids and whole-µs times take an inline test for an int within bounds; anything
        # else goes through _to_int and kineto_time_ns, whose first lines are the same test.
        for n, e in enumerate(ijson.items(fh, "traceEvents.item", use_float=True)):
            if not n % _FLUSH_EVERY:
                for frame in frames:
                    frame.flush()
            if not isinstance(e, dict):
                continue
            cat = e.get("cat")
            ts = e.get("ts")
            ph = e.get("ph")
            if ts.__class__ is int and -MAX_US < ts < MAX_US:
                ts_ns: int | None = ts * US_NS
            else:
                fractional = fractional or hta_rounds(ts)
                ts_ns = kineto_time_ns(ts)
            # Only string categories and phases route events (anything else is not Kineto's).
            if ts is None or not isinstance(cat, str) or not isinstance(ph, str):
                continue
            if ph == "X":
                dur = e.get("dur", 0) or 0
                dur_ns = dur * US_NS if dur.__class__ is int and 0 <= dur < MAX_US else kineto_time_ns(dur)
                if ts_ns is None or dur_ns is None or dur_ns < 0:
                    bad_times += 1
                    continue
                args = e.get("args")
                if not isinstance(args, dict):
                    args = {}
                if cat in KERNEL_CATS or cat in SYNC_CATS:
                    corr = args.get("correlation")
                    corr = corr if corr.__class__ is int and _I64_MIN <= corr <= _I64_MAX else _to_int(corr)
                    if corr < 0 and cat in KERNEL_CATS:
                        kernels_without_corr += 1
                    (kernel_row if cat in KERNEL_CATS else sync_row)((
                        e.get("name"), cat, ts_ns, dur_ns, _to_int(args.get("device", e.get("pid"))),
                        _to_int(args.get("stream", e.get("tid"))), corr))
                    continue
                if "stream" in args and cat != "Trace" and _on_a_stream(args["stream"]):
                    cpu_stream_events += 1
                if cat in CPU_OP_CATS:
                    pid, tid, ext = e.get("pid"), e.get("tid"), args.get("External id")
                    cpu_op_row((
                        e.get("name"), cat, ts_ns, dur_ns,
                        pid if pid.__class__ is int and _I64_MIN <= pid <= _I64_MAX else _to_int(pid),
                        tid if tid.__class__ is int and _I64_MIN <= tid <= _I64_MAX else _to_int(tid),
                        ext if ext.__class__ is int and _I64_MIN <= ext <= _I64_MAX else _to_int(ext)))
                elif cat in RUNTIME_CATS:
                    pid, tid, corr = e.get("pid"), e.get("tid"), args.get("correlation")
                    runtime_row((
                        e.get("name"), ts_ns, dur_ns,
                        pid if pid.__class__ is int and _I64_MIN <= pid <= _I64_MAX else _to_int(pid),
                        tid if tid.__class__ is int and _I64_MIN <= tid <= _I64_MAX else _to_int(tid),
                        corr if corr.__class__ is int and _I64_MIN <= corr <= _I64_MAX else _to_int(corr)))
                elif cat in GPU_ANNOTATION_CATS:
                    annotation_row((e.get("name"), ts_ns, dur_ns, _to_int(args.get("device", e.get("pid"))),
                                    _to_int(args.get("stream", e.get("tid")))))
            elif ph in FLOW_PHASES and cat in FLOW_CATS:
                if ts_ns is None:
                    bad_times += 1
                    continue
                flow_row((_to_int(e.get("id")), cat, ph, ts_ns, _to_int(e.get("pid")), _to_int(e.get("tid"))))
        for frame in frames:
            frame.flush()
        tail = fh.tail
    parsed = {
        "names": names, "cats": cats, "kernels": k, "syncs": s, "runtime": r, "cpu_ops": c,
        "gpu_annotations": g, "flows": f, "fractional": fractional, "cpu_stream_events": cpu_stream_events,
        "kernels_without_corr": kernels_without_corr, "bad_times": bad_times,
    }
    return head, _read_tail(tail), parsed


def _columns(buf: _Columns, columns: tuple[str, ...], names: np.ndarray, cats: np.ndarray,
             clock_offset_ns: int = 0) -> Columns:
    data: dict[str, np.ndarray] = {}
    vocab: dict[str, np.ndarray] = {}
    n = len(buf)
    for col in columns:
        if col == "end_ns":
            continue
        src = {"ts_ns": "ts", "dur_ns": "dur"}.get(col, col)
        values = buf.cols[src]
        # A view of the array buffer, not a copy: the buffers are not appended to after reading,
        # and copying would double the frames' share of peak memory.
        if col == "name" or col in ("cat", "phase"):
            data[col] = np.frombuffer(values, dtype=np.int32) if n else np.array([], dtype=np.int32)
            vocab[col] = names if col == "name" else cats
        else:
            data[col] = np.frombuffer(values, dtype=np.int64) if n else np.array([], dtype=np.int64)
    if "ts_ns" in data and clock_offset_ns:
        data["ts_ns"] = data["ts_ns"] + np.int64(clock_offset_ns)  # a new array; the view's buffer is freed
    if "end_ns" in columns:
        data["end_ns"] = data["ts_ns"] + data["dur_ns"]
    return Columns(columns, data, vocab)


def clock_offset_ns(meta: dict[str, Any]) -> int:
    """Nanoseconds to add to a trace time (Kineto ``ts`` × 1000) to get CLOCK_REALTIME nanoseconds.

    Kineto in PyTorch ≥ 2.1 writes ``ts`` in µs on its own clock, relative to a top-level
    ``baseTimeNanoseconds`` (wall clock at an instant it chose); older Kineto wrote ``ts`` as
    wall-clock µs since the epoch and no base. So the offset is ``baseTimeNanoseconds`` when the
    trace has it, else 0; either way ``ts_ns + offset`` is CLOCK_REALTIME, the clock of Chopper's
    markers and samples (DESIGN "Data model").
    """
    base = meta.get("baseTimeNanoseconds")
    # Bounded like every time (``MAX_NS``), so that ts + base + dur stays within int64.
    return base if isinstance(base, int) and not isinstance(base, bool) and 0 < base < MAX_NS else 0


def _any_name_starts(frame: Columns, prefix: str) -> bool:
    uniques, _ = frame.factorize("name")
    return any(str(n).startswith(prefix) for n in uniques)


def _detect_device_type(meta: dict[str, Any], runtime: Columns, kernels: Columns) -> str:
    props = meta.get("deviceProperties")
    props = props if isinstance(props, list) else []
    gpu_names = " ".join(str(p.get("name", "")) for p in props if isinstance(p, dict))
    if re.search(r"AMD|Radeon|Instinct|MI\d{3}", gpu_names):
        return "rocm"
    if _any_name_starts(runtime, "hip") or _any_name_starts(kernels, "Cijk_"):
        return "rocm"
    return "cuda"


def _detect_rank(path: Path, meta: dict[str, Any]) -> tuple[int, int | None]:
    dist = meta.get("distributedInfo")
    world = None
    if isinstance(dist, dict):
        world = _to_int(dist.get("world_size"), default=-1)
        world = world if world > 0 else None
        rank = _to_int(dist.get("rank"), default=-1)
        if rank >= 0:
            return rank, world
    m = _RANK_IN_NAME.search(path.name)
    return (int(m.group(1)) if m else 0), world


def _assemble(path: Path, meta: dict[str, Any], p: dict[str, Any], require_gpu: bool) -> Trace:
    names, cats = p["names"].vocab(), p["cats"].vocab()
    offset = clock_offset_ns(meta)

    def columns(key: str, contract: tuple[str, ...]) -> Columns:
        return _columns(p[key], contract, names, cats, offset)

    kernels = columns("kernels", KERNEL_COLUMNS)
    if require_gpu and not len(kernels) and p["bad_times"]:
        raise _bad(path, f"no usable GPU kernels: {p['bad_times']} events have a ts or dur that is not a number of "
                   f"µs within ±{MAX_NS} ns, or a negative dur", "The file is not a trace torch.profiler wrote; "
                   "record it again")
    if require_gpu and not len(kernels):
        raise _bad(path, "no GPU kernels (no events with cat kernel / gpu_memcpy / gpu_memset): a CPU-only profile",
                   "Record with torch.profiler activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] "
                   "(CUDA also covers ROCm) so GPU activity is traced")
    runtime = columns("runtime", RUNTIME_COLUMNS)
    cpu_ops = columns("cpu_ops", CPU_OP_COLUMNS)
    gpu_annotations = columns("gpu_annotations", GPU_ANNOTATION_COLUMNS)
    flows = columns("flows", FLOW_COLUMNS)
    syncs = columns("syncs", KERNEL_COLUMNS)
    rank, world = _detect_rank(path, meta)
    warnings: list[str] = []
    if p["bad_times"]:
        warnings.append(
            f"{path}: {p['bad_times']} events were skipped: their ts or dur is not a number of µs within "
            f"±{MAX_NS} ns, or their dur is negative")
    missing = p["kernels_without_corr"]
    if missing:
        warnings.append(
            f"{path}: {missing} of {len(kernels)} GPU kernels have no correlation id (stored as -1): they "
            "cannot be linked to their launching runtime call, so the hierarchy leaves cpu_op, layer, phase "
            "and iteration empty for them, and the ProfilerStep filter of the temporal, overlap and "
            "kernel-type analyses keeps them unfiltered")
    if p["cpu_stream_events"]:
        warnings.append(
            f"{path}: {p['cpu_stream_events']} events off the GPU timeline (CPU ops, runtime calls, annotations) "
            "carry a 'stream' argument (Triton / Inductor launches do): Holistic Trace Analysis 0.5.0 counts them as "
            "GPU kernels and so reports more compute and less idle time; chopper counts only kernels, memcpys, "
            "memsets and syncs (docs/TRACE.md, 'Where we differ from HTA')")
    return Trace(
        path=path, rank=rank, world_size=world, device_type=_detect_device_type(meta, runtime, kernels),
        kernel_columns=kernels, runtime_columns=runtime, cpu_op_columns=cpu_ops,
        gpu_annotation_columns=gpu_annotations, flow_columns=flows, gpu_sync_columns=syncs,
        clock_offset_ns=offset, fractional_ts=p["fractional"], cpu_stream_events=p["cpu_stream_events"],
        metadata=meta, warnings=warnings,
    )
