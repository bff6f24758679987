"""One line of an NCCL/RCCL Inspector JSON dump, parsed and checked.

The Inspector profiler plugin (NVIDIA/nccl ``ext-profiler/inspector/`` from NCCL 2.28.3, later
``plugins/profiler/inspector/``; ROCm/rccl carries a port) writes one file per process,
``<NCCL_INSPECTOR_DUMP_DIR>/<hostname>-pid<pid>.log``, as JSON lines: each object compact (no
spaces, ``jsonKey`` writes ``"key":``), then ``"\\n"``. Integers are printed with ``%lu``/``%d``,
doubles with ``%lf`` (six decimals) and a NaN double as the *string* ``"nan"`` (``json.cc``).
docs/INSPECTOR.md gives every field, version and source commit; in short:

- ``header``: ``id`` (the communicator hash, ``"0x%lx"``), ``comm_name`` (v4.1 and later),
  ``rank``, ``n_ranks``, ``nnodes``.
- ``metadata``: ``inspector_output_format_version``, ``git_rev``, ``rec_mechanism``,
  ``dump_timestamp_us`` (``gettimeofday``: CLOCK_REALTIME microseconds, taken when the dump
  thread writes the line, after the collective completed), ``hostname``, ``pid``.
- one of ``coll_perf`` (a collective), ``p2p_perf`` (a send or receive, later versions),
  ``dump_stats`` (v4.1 and later: a marker line per communicator and dump with the plugin's ring
  drop counts) or ``proxy_trace`` (v4.3 and later: proxy progress, not read here).
- ``coll_perf``: ``coll``, ``coll_sn`` (numbered per collective type and communicator),
  ``coll_msg_size_bytes`` (element count times element size, as the call was given),
  ``coll_exec_time_us``, ``coll_timing_source`` (``kernel_gpu``: the GPU globaltimer difference
  of the slowest channel; ``kernel_cpu``: host callback times of the slowest channel;
  ``collective_cpu``: host times of the whole collective), ``coll_algobw_gbs``,
  ``coll_busbw_gbs`` (GB/s, 1e9 bytes), ``coll_algo``/``coll_proto`` (v4.2 and later), and with
  ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` the ``event_trace_sn``/``event_trace_ts`` blocks.
- From v4.4 the ``coll_perf``/``p2p_perf`` lines after a ``dump_stats`` marker carry no
  ``header``/``metadata``: they inherit the marker's (:class:`RecordDecoder` keeps it per file).

Begin and end of a record (``begin_ns``, ``end_ns``), only where the line has
``event_trace_ts`` (verbose mode; a non-verbose line carries no begin time at all, only
``dump_timestamp_us``):

1. Take the ``kernel_events`` of ``event_trace_ts``; drop timestamps that are 0 (a callback the
   plugin never saw).
2. ``begin`` = the earliest ``kernel_start_ts``, ``end`` = the latest ``kernel_stop_ts``. This
   is the interval the plugin itself measures as ``collective_cpu`` (its start is overwritten by
   the first channel's kernel start, its completion is the last channel's kernel stop).
3. Both are host ``gettimeofday`` microseconds taken in the plugin's callbacks (the GPU
   globaltimer values behind ``kernel_gpu`` are never written): already CLOCK_REALTIME, so
   nanoseconds are ``us * 1000``, no offset. They lag the GPU by the proxy thread's polling.
4. No usable channel, or ``end < begin`` (the wall clock stepped): both None.

``coll_start_ts``/``coll_stop_ts`` are not used: they bracket the host-side enqueue of the
call, microseconds long, not the collective's execution.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

SUPPORTED_VERSIONS: Final[tuple[str, ...]] = ("v4.0", "v4.1", "v4.2", "v4.3", "v4.4")

REJECTION_REASONS: Final[dict[str, str]] = {
    "not_json": "the line is not one JSON value in UTF-8 (a torn write, or not an Inspector dump)",
    "not_an_object": "the line is JSON but not an object",
    "unknown_version": "metadata.inspector_output_format_version is not a version this agent reads",
    "unknown_kind": "the object has none of coll_perf, p2p_perf, dump_stats, proxy_trace",
    "missing_field": "a field the format requires is absent",
    "bad_field": "a field has the wrong type, or a value outside its range",
    "missing_context": "a v4.4 line without header/metadata and no dump_stats line before it in its file",
    "line_too_long": "a line longer than the reader's record limit, skipped to the next newline",
}

# What ncclFuncToString writes (inspector.cc); a name outside it is kept, callers bucket it.
KNOWN_COLLECTIVES: Final[frozenset[str]] = frozenset({
    "AllGather", "AllReduce", "Broadcast", "Reduce", "ReduceScatter", "SendRecv", "Send", "Recv",
    "All2All", "AllGatherV",
})
TIMING_SOURCES: Final[tuple[str, ...]] = ("kernel_gpu", "kernel_cpu", "collective_cpu", "unknown")

_UINT64: Final = 2**64 - 1
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
_COMM_ID = re.compile(r"0x[0-9a-f]{1,16}")
_MAX_HOSTNAME: Final = 255          # gethostname(hostname, 255) in the plugin
_MAX_CHANNELS: Final = 1024         # the plugin has MAX_CHANNELS 64; more is not its output
_FIX: Final = ("the line is not as the Inspector plugin writes it; point inspector_dir at a directory "
               "only the plugin writes (NCCL_INSPECTOR_DUMP_DIR, JSON mode: NCCL_INSPECTOR_PROM_DUMP=0)")
_MISSING: Final = object()


class InspectorFormatError(ValueError):
    """A line that is not an Inspector record this agent reads.

    Attributes:
        reason: A key of ``REJECTION_REASONS``.
        version: The refused version text (at most 32 characters) when ``reason`` is
            ``unknown_version``, else None.
    """

    def __init__(self, reason: str, message: str, version: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.version = version


@dataclass(frozen=True, slots=True)
class RecordContext:
    """The ``header`` and ``metadata`` of a line: which communicator rank and process wrote it, when."""

    comm_id: str
    comm_rank: int
    comm_ranks: int
    comm_nodes: int
    hostname: str
    pid: int
    dump_ns: int                    # CLOCK_REALTIME ns: dump_timestamp_us * 1000
    version: str
    comm_name: str = ""


@dataclass(frozen=True, slots=True)
class InspectorRecord:
    """One completed collective (or, ``kind == "p2p"``, send/receive) of one communicator rank.

    Units: ``bytes`` as the call was given (count × element size, per rank), ``exec_s`` seconds,
    ``algo_gbs``/``bus_gbs`` 1e9 bytes per second (NaN where the plugin wrote ``"nan"``), every
    ``*_ns`` CLOCK_REALTIME nanoseconds. ``seq`` is numbered per collective type and communicator,
    so ``(comm_id, comm_rank, collective, seq)`` names one operation.
    """

    collective: str
    seq: int
    bytes: int
    exec_s: float
    timing_source: str
    algo_gbs: float
    bus_gbs: float
    comm_id: str
    comm_rank: int
    comm_ranks: int
    comm_nodes: int
    hostname: str
    pid: int
    dump_ns: int
    begin_ns: int | None
    end_ns: int | None
    version: str
    kind: str = "coll"
    peer: int | None = None
    comm_name: str = ""
    algo: str = ""
    proto: str = ""


@dataclass(frozen=True, slots=True)
class DumpStats:
    """A ``dump_stats`` marker (v4.1 and later): records the plugin wrote and dropped for one communicator.

    ``*_dropped_since_last_dump`` are operations the plugin's ring overwrote before its dump
    thread wrote them: collectives that happened and that no line will ever show.
    """

    context: RecordContext
    coll_records: int
    coll_dropped_total: int
    coll_dropped_since_last_dump: int
    p2p_records: int
    p2p_dropped_total: int
    p2p_dropped_since_last_dump: int


def parse_line(line: bytes | str) -> dict[str, Any]:
    """The JSON object of one dump line (without its newline). Raises ``InspectorFormatError``."""
    try:
        obj = json.loads(line, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise InspectorFormatError(
            "not_json", f"not a JSON line ({type(exc).__name__}: {_short(str(exc))}): {_FIX}") from None
    if not isinstance(obj, dict):
        raise InspectorFormatError("not_an_object", f"a JSON {type(obj).__name__}, not an object: {_FIX}")
    return obj


def record_kind(obj: Mapping[str, Any]) -> str:
    """Which kind of line ``obj`` is: ``coll``, ``p2p``, ``dump_stats`` or ``proxy_trace``.

    A line carrying ``metadata`` has its version checked first, so that a newer format is refused
    by name rather than as an unknown kind.
    """
    if "metadata" in obj:
        _version(_section(obj, "metadata"))
    for key, kind in (("coll_perf", "coll"), ("p2p_perf", "p2p"), ("dump_stats", "dump_stats"),
                      ("proxy_trace", "proxy_trace")):
        if key in obj:
            return kind
    raise InspectorFormatError("unknown_kind", "the object has none of coll_perf, p2p_perf, dump_stats, "
                               f"proxy_trace (keys: {_keys(obj)}): {_FIX}")


def parse_context(obj: Mapping[str, Any]) -> RecordContext:
    """The ``header`` and ``metadata`` of a line. Raises ``InspectorFormatError``."""
    metadata = _section(obj, "metadata")
    version = _version(metadata)
    header = _section(obj, "header")
    ranks = _int(header, "header", "n_ranks", 1, 2**31 - 1)
    rank = _int(header, "header", "rank", 0, 2**31 - 1)
    if rank >= ranks:
        raise InspectorFormatError("bad_field", f"header.rank {rank} is not below header.n_ranks {ranks}: {_FIX}")
    comm_id = _text(header, "header", "id", 18)
    if not _COMM_ID.fullmatch(comm_id):
        raise InspectorFormatError("bad_field", f"header.id {comm_id!r} is not a communicator hash (0x + "
                                   f"1 to 16 lowercase hex digits): {_FIX}")
    comm_name = _text(header, "header", "comm_name", 256) if "comm_name" in header else ""
    return RecordContext(
        comm_id=comm_id, comm_rank=rank, comm_ranks=ranks, comm_nodes=_int(header, "header", "nnodes", 1, 2**31 - 1),
        hostname=_text(metadata, "metadata", "hostname", _MAX_HOSTNAME),
        pid=_int(metadata, "metadata", "pid", 1, 2**32 - 1),
        dump_ns=_int(metadata, "metadata", "dump_timestamp_us", 0, _UINT64 // 1000) * 1000,
        version=version, comm_name=comm_name)


def parse_record(obj: object, context: RecordContext | None = None) -> InspectorRecord:
    """A ``coll_perf`` or ``p2p_perf`` line as a record.

    Args:
        obj: The line's JSON object (``parse_line``).
        context: The header and metadata to use when the line has none (v4.4 lines after a
            ``dump_stats`` marker); a line's own header and metadata always win.

    Raises:
        InspectorFormatError: The line is not such a record; ``.reason`` says why.
    """
    if not isinstance(obj, dict):
        raise InspectorFormatError("not_an_object", f"a {type(obj).__name__}, not a JSON object: {_FIX}")
    kind = record_kind(obj)
    if kind not in ("coll", "p2p"):
        raise InspectorFormatError("unknown_kind", f"a {kind} line, not a coll_perf or p2p_perf record: {_FIX}")
    return _perf(obj, kind, context)


def _perf(obj: Mapping[str, Any], kind: str, context: RecordContext | None) -> InspectorRecord:
    """``parse_record`` once the line's kind is known."""
    if "header" in obj or "metadata" in obj:
        context = parse_context(obj)
    elif context is None:
        raise InspectorFormatError("missing_context", f"a {kind}_perf line without header and metadata, and no "
                                   "dump_stats line before it in this file (v4.4 lines inherit the marker's): "
                                   "the file was read from its middle or is not the plugin's")
    name = f"{kind}_perf"
    perf = _section(obj, name)
    collective = _text(perf, name, kind, 32)
    if not _NAME.fullmatch(collective):
        raise InspectorFormatError("bad_field", f"{name}.{kind} {collective!r} is not an operation name: {_FIX}")
    timing = _text(perf, name, f"{kind}_timing_source", 32) if f"{kind}_timing_source" in perf else "unknown"
    if timing not in TIMING_SOURCES:
        raise InspectorFormatError("bad_field", f"{name}.{kind}_timing_source {timing!r} is not one of "
                                   f"{', '.join(TIMING_SOURCES)}: {_FIX}")
    begin_ns, end_ns = _interval(perf.get("event_trace_ts"), name)
    return InspectorRecord(
        collective=collective,
        seq=_int(perf, name, f"{kind}_sn", 0, _UINT64),
        bytes=_int(perf, name, f"{kind}_msg_size_bytes", 0, _UINT64),
        exec_s=_number(perf, name, f"{kind}_exec_time_us", allow_nan=False) / 1e6,
        timing_source=timing,
        algo_gbs=_number(perf, name, f"{kind}_algobw_gbs", allow_nan=True),
        bus_gbs=_number(perf, name, f"{kind}_busbw_gbs", allow_nan=True),
        comm_id=context.comm_id, comm_rank=context.comm_rank, comm_ranks=context.comm_ranks,
        comm_nodes=context.comm_nodes, hostname=context.hostname, pid=context.pid, dump_ns=context.dump_ns,
        begin_ns=begin_ns, end_ns=end_ns, version=context.version, kind=kind,
        peer=_int(perf, name, "p2p_peer", -1, 2**31 - 1) if kind == "p2p" else None,
        comm_name=context.comm_name,
        algo=_text(perf, name, "coll_algo", 32) if "coll_algo" in perf else "",
        proto=_text(perf, name, "coll_proto", 32) if "coll_proto" in perf else "")


def parse_dump_stats(obj: Mapping[str, Any]) -> DumpStats:
    """A ``dump_stats`` marker line. Raises ``InspectorFormatError``."""
    stats = _section(obj, "dump_stats")
    counts = {key: _int(stats, "dump_stats", key, 0, _UINT64) for key in (
        "coll_records", "coll_dropped_total", "coll_dropped_since_last_dump",
        "p2p_records", "p2p_dropped_total", "p2p_dropped_since_last_dump")}
    return DumpStats(context=parse_context(obj), **counts)


class RecordDecoder:
    """Decodes the lines of one dump file in order, keeping the last ``dump_stats`` marker's header.

    One decoder per file: a v4.4 ``coll_perf`` line means the communicator of the marker written
    before it in the same file. Start a new decoder when the file starts over (truncated, replaced).
    A refused line that may have been a marker, and a gap in the reading (``forget``), drop the
    kept header: the bare lines up to the next marker are then refused (``missing_context``) rather
    than given to the communicator of an older marker.
    """

    def __init__(self) -> None:
        self._context: RecordContext | None = None

    def forget(self) -> None:
        """Drop the kept header: lines were skipped, or a line could not be read at all."""
        self._context = None

    def decode(self, obj: dict[str, Any]) -> InspectorRecord | DumpStats | None:
        """The record or marker of one line, or None for a kind this agent does not read (proxy_trace).

        Raises:
            InspectorFormatError: The line is refused; ``.reason`` says why.
        """
        bare = ("coll_perf" in obj or "p2p_perf" in obj) and "header" not in obj and "metadata" not in obj
        try:
            kind = record_kind(obj)
            if kind == "dump_stats":
                stats = parse_dump_stats(obj)
                self._context = stats.context
                return stats
            if kind == "proxy_trace":
                return None
            return _perf(obj, kind, self._context)
        except InspectorFormatError:
            if not bare:  # perhaps the marker of the lines that follow
                self._context = None
            raise


def _interval(trace: object, name: str) -> tuple[int | None, int | None]:
    """(begin_ns, end_ns) from a verbose ``event_trace_ts`` block, by the steps of the module docstring."""
    if trace is None:
        return None, None
    where = f"{name}.event_trace_ts"
    if not isinstance(trace, dict):
        raise InspectorFormatError("bad_field", f"{where} is a {type(trace).__name__}, not an object: {_FIX}")
    events = trace.get("kernel_events", [])
    if not isinstance(events, list) or len(events) > _MAX_CHANNELS:
        raise InspectorFormatError("bad_field", f"{where}.kernel_events is not a list of at most {_MAX_CHANNELS} "
                                   f"channels: {_FIX}")
    starts, stops = [], []
    for event in events:
        if not isinstance(event, dict):
            raise InspectorFormatError("bad_field", f"{where}.kernel_events holds a {type(event).__name__}: {_FIX}")
        starts.append(_int(event, f"{where}.kernel_events[]", "kernel_start_ts", 0, _UINT64 // 1000))
        stops.append(_int(event, f"{where}.kernel_events[]", "kernel_stop_ts", 0, _UINT64 // 1000))
    starts = [t for t in starts if t]
    stops = [t for t in stops if t]
    if not starts or not stops or max(stops) < min(starts):
        return None, None
    return min(starts) * 1000, max(stops) * 1000


def _version(metadata: Mapping[str, Any]) -> str:
    version = metadata.get("inspector_output_format_version", _MISSING)
    if version is _MISSING:
        raise InspectorFormatError("missing_field", f"metadata.inspector_output_format_version is missing: {_FIX}")
    if version not in SUPPORTED_VERSIONS:
        shown = str(version)[:32]
        raise InspectorFormatError(
            "unknown_version",
            f"inspector_output_format_version {shown!r} is not one this agent reads "
            f"({', '.join(SUPPORTED_VERSIONS)}): the plugin is newer (or older) than this agent; upgrade "
            "chopper-agent, or build the Inspector plugin from a release that writes one of these",
            version=shown)
    return str(version)


def _section(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key, _MISSING)
    if value is _MISSING:
        raise InspectorFormatError("missing_field", f"{key} is missing (keys: {_keys(obj)}): {_FIX}")
    if not isinstance(value, dict):
        raise InspectorFormatError("bad_field", f"{key} is a {type(value).__name__}, not an object: {_FIX}")
    return value


def _int(section: Mapping[str, Any], where: str, key: str, low: int, high: int) -> int:
    value = section.get(key, _MISSING)
    if value is _MISSING:
        raise InspectorFormatError("missing_field", f"{where}.{key} is missing: {_FIX}")
    if type(value) is not int or not low <= value <= high:  # bool is an int subclass: refused too
        raise InspectorFormatError("bad_field", f"{where}.{key} is {_short(value)}, not an integer in "
                                   f"[{low}, {high}]: {_FIX}")
    return value


def _number(section: Mapping[str, Any], where: str, key: str, *, allow_nan: bool) -> float:
    value = section.get(key, _MISSING)
    if value is _MISSING:
        raise InspectorFormatError("missing_field", f"{where}.{key} is missing: {_FIX}")
    if allow_nan and value == "nan":  # jsonDouble writes a NaN double as the string "nan"
        return math.nan
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise InspectorFormatError("bad_field", f"{where}.{key} is {_short(value)}, not a number >= 0: {_FIX}")
    return float(value)


def _text(section: Mapping[str, Any], where: str, key: str, limit: int) -> str:
    value = section.get(key, _MISSING)
    if value is _MISSING:
        raise InspectorFormatError("missing_field", f"{where}.{key} is missing: {_FIX}")
    if not isinstance(value, str) or not 0 < len(value) <= limit or not value.isprintable():
        raise InspectorFormatError("bad_field", f"{where}.{key} is {_short(value)}, not printable text of 1 to "
                                   f"{limit} characters: {_FIX}")
    return value


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _keys(obj: Mapping[str, Any]) -> str:
    keys = sorted(str(k)[:32] for k in list(obj)[:8])
    return ", ".join(keys) + (", ..." if len(obj) > 8 else "") if keys else "none"


def _short(value: object) -> str:
    """A bounded repr for messages: a bad line must not make a log line long."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
