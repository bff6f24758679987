"""Record a live agent's devices, samples, markers and Inspector collectives into a recorded run directory.

``chopper record`` is the bridge from a running node to the offline tools: what it writes is a
DESIGN "recorded run" (``devices``, ``samples``, ``markers`` and ``collectives`` as Parquet,
written through ``chopper.runs.rundir.write_run``), which the ``replay`` backend plays back and
``chopper attribute`` analyzes.

Algorithm:

1. Refuse an existing non-empty output directory unless ``force`` (an earlier run must not be
   half-overwritten by accident).
2. ``GetInfo`` from the agent: one ``devices`` row per GPU. An agent that does not answer raises
   ``consumer.AgentUnreachable`` before anything is created.
3. ``Subscribe(samples=True, markers=True, since_ns=...)``: ``since_ns = 1`` replays everything
   the agent's buffers still hold, ``since_ns = now`` records from now on. The agent sends the
   Inspector's collective records (``TelemetryBatch.collectives``) with the markers; a record
   whose values the data model cannot hold (a 64-bit count beyond int64, an end before its
   begin, a value outside ``rundir.BOUNDS``) is left out and counted, so that it cannot make
   ``write_run`` refuse everything else collected. Rows are accumulated
   column by column in typed arrays (8 bytes per number), never as protobuf objects, so an hour
   at 8 GPUs x 100 Hz stays in the hundreds of megabytes.
4. Stop when ``duration_s`` has passed, when ``stop`` is set (the CLI sets it on SIGINT/SIGTERM)
   or when the stream ends because the agent went away. A watcher thread cancels the stream for
   the first two, so a quiet stream cannot delay the stop.
5. Write everything collected, in every one of those cases, and report counts, the items the
   agent said this subscriber missed (``missed_total``) and why the recording ended. A write that
   fails (disk full, no permission) removes the table files it left half-written and raises
   ``RecordError`` naming the directory, the cause and the way back: the agent's buffers still
   hold the recent past, which ``since_ns=1`` (``--since-buffer``) records again.

grpc, numpy and pandas are imported here, not in ``chopper/__init__``, so ``import chopper``
stays light.
"""
from __future__ import annotations

import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from chopper.runs.rundir import COLLECTIVE_COLUMNS, OPTIONAL_TABLES, TABLES, table_files
from chopper.schema import (
    DEVICE_COLUMNS,
    ERROR_COLUMNS,
    LINK_COLUMNS,
    MARKER_COLUMNS,
    MAX_LINKS,
    SAMPLE_COLUMNS,
    MarkerKind,
)

if TYPE_CHECKING:
    import pandas as pd

    from chopper.proto.chopper.v1 import agent_pb2 as pb
    from chopper.runs.connect import ClientSecurity

# How often the watcher checks the stop event and the deadline, seconds: the worst-case delay
# between Ctrl-C (or the end of --duration) and the stream being cancelled.
_POLL_S = 0.05
# Seconds to wait for GetInfo; an agent that needs longer is not serving.
CONNECT_TIMEOUT_S = 5.0

# Typecodes of the numeric columns ('q' int64, 'd' float64); every other column is text.
_SAMPLE_INT = frozenset({"ts_ns", "gpu"})
_SAMPLE_TEXT = frozenset({"node"})
_LINK_INT = frozenset({"ts_ns", "gpu", "link"})
_LINK_TEXT = frozenset({"node"})
_ERROR_INT = frozenset({"ts_ns", "gpu"})
# chip_wide rides in a list like the text columns (booleans, not doubles).
_ERROR_LISTS = frozenset({"node", "kind", "window", "detail", "chip_wide"})
_MARKER_INT = frozenset({"ts_ns", "rank", "gpu", "step"})
_MARKER_TEXT = frozenset({"job", "node", "kind", "name"})
_COLLECTIVE_FLOAT = frozenset({"exec_s", "algo_bandwidth_gbs", "bus_bandwidth_gbs"})
_COLLECTIVE_TEXT = frozenset({"job", "node", "collective", "timing_source", "comm_id", "format_version"})
# Everything else is a whole number; "placed" (a bool) is kept as 0/1.
_COLLECTIVE_INT = frozenset(COLLECTIVE_COLUMNS) - _COLLECTIVE_FLOAT - _COLLECTIVE_TEXT
_INT64_MAX = 2**63 - 1
# Which marker kinds carry which payload fields; elsewhere they are NaN, not the proto's 0, so
# that "not applicable" cannot be mistaken for "zero FLOPs".
_STEP_END = int(MarkerKind.STEP_END)
_COLLECTIVES = frozenset({int(MarkerKind.COLLECTIVE_BEGIN), int(MarkerKind.COLLECTIVE_END)})
_KIND_LABELS: dict[int, str] = {int(k): k.label for k in MarkerKind}
_NAN = float("nan")


class RecordError(RuntimeError):
    """The recording cannot start or cannot be written; the message names the problem and the fix."""


class OutputNotEmpty(RecordError):
    """The output directory already holds files and ``force`` was not given."""


@dataclass(frozen=True)
class RecordStats:
    """What a recording wrote.

    Attributes:
        out: The run directory written.
        node: The agent's node name.
        devices: Device rows written (GPUs the agent reported).
        gpus: Distinct ``(node, gpu)`` that have at least one sample.
        samples: Sample rows written.
        markers: Marker rows written.
        missed: Items (samples and markers) the agent dropped for this subscriber because it
            fell behind the agent's buffers (the stream's cumulative ``missed_total``).
        duration_s: Wall-clock seconds from opening the stream to its end.
        ended_by: ``"duration"``, ``"stop"`` (event or signal) or ``"agent"`` (the agent went
            away or ended the stream).
        agent_error: When ``ended_by == "agent"``: what the stream said, e.g.
            ``"UNAVAILABLE: Socket closed"``; otherwise None.
        unknown_kinds: Markers left out because their kind is newer than this schema.
        collectives: Inspector collective rows written.
        unfit_collectives: Inspector records left out because the data model cannot hold their
            values (``_fits``).
        links: Per-link counter rows written (one per sample and NVLink / XGMI link).
        unfit_links: Link entries left out because their index is beyond ``MAX_LINKS``.
        errors: Health and error counter rows written (one per sample and counter).
    """

    out: Path
    node: str
    devices: int
    gpus: int
    samples: int
    markers: int
    missed: int
    duration_s: float
    ended_by: str
    agent_error: str | None = None
    unknown_kinds: int = 0
    collectives: int = 0
    unfit_collectives: int = 0
    links: int = 0
    unfit_links: int = 0
    errors: int = 0


def check_output(out: Path, force: bool = False) -> None:
    """Refuse an output path that would clobber something.

    Args:
        out: Run directory to be written.
        force: Accept an existing non-empty directory (its run tables are replaced; other files
            in it are left alone).

    Raises:
        OutputNotEmpty: ``out`` is a non-empty directory and ``force`` is False.
        RecordError: ``out`` exists and is not a directory.
    """
    if out.exists() and not out.is_dir():
        raise RecordError(f"--out {str(out)!r} is a file, not a directory; choose a directory path")
    if out.is_dir() and not force and any(out.iterdir()):
        raise OutputNotEmpty(f"--out directory {str(out)!r} is not empty; choose a new directory or pass "
                             "--force to replace the run tables in it")


class _Columns:
    """Column-wise accumulation of rows: typed arrays for numbers, lists of shared strings for text."""

    def __init__(self, columns: tuple[str, ...], ints: frozenset[str], texts: frozenset[str]) -> None:
        self.columns = columns
        self.data: dict[str, Any] = {
            c: [] if c in texts else array("q" if c in ints else "d") for c in columns
        }
        # Node, job and phase names repeat on every row: keep one string object per distinct value.
        self._interned: dict[str, str] = {}
        self.rows = 0

    def text(self, value: str) -> str:
        return self._interned.setdefault(value, value)

    def frame(self) -> pd.DataFrame:
        import numpy as np
        import pandas as pd

        return pd.DataFrame({
            c: (v if isinstance(v, list) else np.frombuffer(v, dtype=np.int64 if v.typecode == "q" else np.float64))
            for c, v in self.data.items()
        }, columns=list(self.columns))


def _device_rows(info: pb.AgentInfo) -> list[dict[str, Any]]:
    # compute_share 0 is the field unset: an agent older than partitions, whose devices are whole chips.
    return [
        {c: getattr(d, c) for c in DEVICE_COLUMNS} | {"node": d.node or info.node,
                                                      "compute_share": d.compute_share or 1.0}
        for d in info.devices
    ]


def record(
    target: str,
    out: Path,
    duration_s: float | None,
    since_ns: int,
    stop: threading.Event | None = None,
    *,
    force: bool = False,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    security: ClientSecurity | None = None,
) -> RecordStats:
    """Record an agent's devices, samples, markers and Inspector collectives into the run directory ``out``.

    Args:
        target: Agent gRPC target, ``unix:///run/chopper/agent.sock`` or ``host:port``.
        out: Run directory to write (created with its parents).
        duration_s: Seconds to record after the stream opens; None records until ``stop`` is
            set or the agent goes away.
        since_ns: First timestamp wanted, CLOCK_REALTIME nanoseconds: ``1`` replays whatever the
            agent's buffers still hold, ``time.time_ns()`` records from now on. ``0`` means
            live only (the agent's own meaning).
        stop: Set it to end the recording early (from another thread or a signal handler).
        force: Accept an existing non-empty ``out`` (see ``check_output``).
        connect_timeout_s: Seconds to wait for the agent's ``GetInfo``.
        security: TLS and bearer token for the agent (``chopper.runs.connect``); None: plaintext.

    Returns:
        Counts of what was written and why the recording ended.

    Raises:
        OutputNotEmpty: ``out`` holds files and ``force`` is False (checked before connecting).
        RecordError: ``out`` is a file.
        consumer.AgentUnreachable: No agent answered ``GetInfo``; nothing was written.
        chopper.runs.rundir.RunDirError: The agent sent rows that do not fit the data model.
    """
    import grpc

    from chopper.proto.chopper.v1 import agent_pb2 as pb
    from chopper.runs import consumer

    out = Path(out)
    check_output(out, force)
    info = consumer.wait_for_info(target, timeout_s=connect_timeout_s, security=security)
    devices = _device_rows(info)

    samples = _Columns(SAMPLE_COLUMNS, _SAMPLE_INT, _SAMPLE_TEXT)
    markers = _Columns(MARKER_COLUMNS, _MARKER_INT, _MARKER_TEXT)
    collectives = _Columns(COLLECTIVE_COLUMNS, _COLLECTIVE_INT, _COLLECTIVE_TEXT)
    links = _Columns(LINK_COLUMNS, _LINK_INT, _LINK_TEXT)
    errors = _Columns(ERROR_COLUMNS, _ERROR_INT, _ERROR_LISTS)
    unfit_links = 0
    gpus: set[tuple[str, int]] = set()
    missed = 0
    unknown_kinds = 0
    unfit_collectives = 0
    stop = stop if stop is not None else threading.Event()
    channel, stream = consumer.subscribe(target, pb.SubscribeRequest(samples=True, markers=True, since_ns=since_ns),
                                         security)
    started = time.monotonic()
    deadline = None if duration_s is None else started + duration_s
    reading_done = threading.Event()
    cancelled_for: list[str] = []  # written by the watcher before it cancels, read after the stream ends

    def watch() -> None:
        while not reading_done.wait(_POLL_S):
            if stop.is_set():
                reason = "stop"
            elif deadline is not None and time.monotonic() >= deadline:
                reason = "duration"
            else:
                continue
            cancelled_for.append(reason)
            # The stream is a grpc call object; cancelling it wakes the reader even when the agent
            # has nothing to send.
            cast(Any, stream).cancel()
            return

    watcher = threading.Thread(target=watch, name="chopper-record-watch", daemon=True)
    watcher.start()
    agent_error: str | None = None
    s_cols = [(c, samples.data[c]) for c in SAMPLE_COLUMNS if c not in _SAMPLE_TEXT]
    s_nodes: list[str] = samples.data["node"]
    try:
        for batch in stream:
            missed = max(missed, batch.missed_total)
            for s in batch.samples:
                for c, column in s_cols:
                    column.append(getattr(s, c))
                node = samples.text(s.node)
                s_nodes.append(node)
                gpus.add((node, s.gpu))
                if s.links:
                    unfit_links += _append_links(links, s, node)
                if s.errors:
                    _append_errors(errors, s, node)
            samples.rows += len(batch.samples)
            for r in batch.markers:
                if not _append_marker(markers, r):
                    unknown_kinds += 1
            for rec in batch.collectives:
                if not _append_collective(collectives, rec):
                    unfit_collectives += 1
        # A stream that ends cleanly without our cancel means the agent closed it (shutdown).
        if not cancelled_for:
            agent_error = "the agent ended the stream"
    except grpc.RpcError as exc:
        if not cancelled_for:
            agent_error = f"{exc.code().name}: {exc.details()}"
    finally:
        reading_done.set()
        channel.close()
        watcher.join()
    elapsed = time.monotonic() - started

    inspector, unfit = _fitting(collectives.frame().astype({"placed": bool}))
    unfit_collectives += unfit
    _write(out, devices, samples, markers, inspector, links, errors)
    return RecordStats(
        out=out, node=info.node, devices=len(devices), gpus=len(gpus), samples=samples.rows,
        markers=markers.rows, missed=missed, duration_s=elapsed,
        ended_by="agent" if agent_error is not None else cancelled_for[0], agent_error=agent_error,
        unknown_kinds=unknown_kinds, collectives=len(inspector), unfit_collectives=unfit_collectives,
        links=links.rows, unfit_links=unfit_links, errors=errors.rows,
    )


def _write(out: Path, devices: list[dict[str, Any]], samples: _Columns, markers: _Columns,
           inspector: pd.DataFrame, links: _Columns, errors: _Columns) -> None:
    """``write_run``, turning an I/O failure into a ``RecordError`` without half-written tables."""
    from chopper.runs.rundir import write_run

    def stamp(path: Path) -> int | None:
        return path.stat().st_mtime_ns if path.exists() else None

    tables = [path for table in (*TABLES, *OPTIONAL_TABLES) for path in table_files(out, table)]
    before = {path: stamp(path) for path in tables}
    try:
        write_run(out, devices, samples.frame(), markers.frame(), inspector, links.frame() if links.rows else None,
                  errors.frame() if errors.rows else None)
    except OSError as exc:
        for path in tables:
            if stamp(path) != before[path]:
                path.unlink(missing_ok=True)
        raise RecordError(
            f"cannot write the run into {str(out)!r}: {exc.strerror or exc}; the {samples.rows} samples and "
            f"{markers.rows} markers recorded were not written. Free space (or choose another --out) and run "
            "`chopper record --since-buffer` again: the agent's buffers still hold the recent samples and markers"
        ) from exc


def _append_links(links: _Columns, s: pb.Sample, node: str) -> int:
    """Append one row per link of sample ``s``; return how many were left out (index beyond ``MAX_LINKS``)."""
    d = links.data
    unfit = 0
    for k in s.links:
        if k.link >= MAX_LINKS:  # only a newer agent sends one; the run's links table could not hold it
            unfit += 1
            continue
        d["ts_ns"].append(s.ts_ns)
        d["node"].append(node)
        d["gpu"].append(s.gpu)
        d["link"].append(k.link)
        d["tx_bytes"].append(k.tx_bytes)
        d["rx_bytes"].append(k.rx_bytes)
        links.rows += 1
    return unfit


def _append_errors(errors: _Columns, s: pb.Sample, node: str) -> None:
    """Append one row per health counter of sample ``s``."""
    d = errors.data
    for e in s.errors:
        d["ts_ns"].append(s.ts_ns)
        d["node"].append(node)
        d["gpu"].append(s.gpu)
        d["kind"].append(errors.text(e.kind))
        d["window"].append(errors.text(e.window))
        d["detail"].append(errors.text(e.detail))
        d["value"].append(e.value)
        d["chip_wide"].append(e.chip_wide)
    errors.rows += len(s.errors)


def _append_marker(markers: _Columns, r: pb.MarkerRecord) -> bool:
    """Append one marker row; False (nothing appended) for a kind this schema has no label for."""
    m = r.marker
    if m.kind not in _KIND_LABELS:
        # The agent rejects unknown kinds, so only a newer agent sends one; one row the data model
        # cannot express must not make write_run refuse everything else collected.
        return False
    d = markers.data
    d["ts_ns"].append(m.ts_ns)
    d["job"].append(markers.text(r.job))
    d["node"].append(markers.text(r.node))
    d["rank"].append(r.rank)
    d["gpu"].append(r.gpu)
    d["kind"].append(_KIND_LABELS[m.kind])
    d["step"].append(m.step)
    d["name"].append(markers.text(m.name))
    d["flops"].append(float(m.flops) if m.kind == _STEP_END else _NAN)
    d["tokens"].append(float(m.tokens) if m.kind == _STEP_END else _NAN)
    d["bytes"].append(float(m.bytes) if m.kind in _COLLECTIVES else _NAN)
    markers.rows += 1
    return True


def _append_collective(collectives: _Columns, c: pb.CollectiveRecord) -> bool:
    """Append one Inspector collective row; False (nothing appended) for a 64-bit count beyond int64."""
    if max(c.bytes, c.seq, c.pid) > _INT64_MAX:
        return False
    d = collectives.data
    for name in COLLECTIVE_COLUMNS:
        value = getattr(c, name)
        d[name].append(collectives.text(value) if name in _COLLECTIVE_TEXT else value)
    collectives.rows += 1
    return True


def _fitting(collectives: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The rows ``write_run`` accepts (rundir's ``BOUNDS``, end not before begin) and how many were not."""
    import numpy as np

    from chopper.runs.rundir import BOUNDS

    ok = collectives["end_ns"].to_numpy() >= collectives["begin_ns"].to_numpy()
    for column, (lo, hi, _) in BOUNDS["collectives"].items():
        values = collectives[column].to_numpy()
        inside = (values >= lo) & (values <= hi)
        ok &= inside & np.isfinite(values) if values.dtype.kind == "f" else inside
    return collectives[ok], int((~ok).sum())
