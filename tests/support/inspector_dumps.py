"""Inspector dump lines written as the plugin writes them, for fixtures and tests.

The layout follows NVIDIA/nccl ``ext-profiler/inspector/inspector.cc`` (commit 1e0c869c, format
v4.0: ``inspectorCommInfoDump`` writes ``{"header":…,"metadata":…,"coll_perf":…}`` and a newline)
and ``json.cc`` (commit e5d9a7ae: no spaces, ``"key":value``, integers ``%d``/``%lu``, doubles
``%lf``, a NaN double as the string ``"nan"``); the v4.4 marker layout follows
``plugins/profiler/inspector/inspector_json.cc`` (commit f3f1ee07). Bandwidths are the plugin's
``inspectorComputeCollBw`` rule: algorithm bandwidth = traffic / 1e9 / seconds, where traffic is
the message size (AllReduce, Reduce, Broadcast, point-to-point) or size × ranks (AllGather,
ReduceScatter); bus bandwidth = algorithm bandwidth × 2(n-1)/n (AllReduce), (n-1)/n (AllGather,
ReduceScatter), 1 otherwise. The values are ours, not a run's; docs/INSPECTOR.md has the sources.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


def _double(value: float) -> str:
    return '"nan"' if math.isnan(value) else f"{value:.6f}"


def bandwidths(collective: str, size: int, ranks: int, exec_us: int) -> tuple[float, float]:
    """(algorithm, bus) bandwidth in GB/s as the plugin computes them from whole microseconds."""
    seconds = exec_us / 1e6
    if collective in ("AllGather", "ReduceScatter"):
        traffic, factor = size * ranks, (ranks - 1) / ranks
    elif collective == "AllReduce":
        traffic, factor = size, 2 * (ranks - 1) / ranks
    else:
        traffic, factor = size, 1.0
    algo = traffic / 1e9 / seconds if seconds else 0.0
    return algo, algo * factor


@dataclass(frozen=True)
class KernelChannel:
    """One channel's host callback times in microseconds (0: a callback the plugin never saw)."""

    start_us: int
    stop_us: int
    record_us: int


@dataclass(frozen=True)
class Collective:
    """One completed collective of one rank, in the plugin's units."""

    coll: str
    sn: int
    size: int
    exec_us: int
    dump_us: int
    timing_source: str = "kernel_gpu"
    enqueue_us: int = 0                     # coll_start_ts; coll_stop_ts is 5 us later
    channels: tuple[KernelChannel, ...] = field(default=())


@dataclass(frozen=True)
class Comm:
    """A communicator rank in one process."""

    comm_id: str
    rank: int
    ranks: int
    nodes: int
    hostname: str
    pid: int
    comm_name: str = ""


def _header(comm: Comm) -> str:
    name = f'"comm_name":"{comm.comm_name}",' if comm.comm_name else ""
    return f'{{"id":"{comm.comm_id}",{name}"rank":{comm.rank},"n_ranks":{comm.ranks},"nnodes":{comm.nodes}}}'


def _metadata(comm: Comm, dump_us: int, version: str) -> str:
    return (f'{{"inspector_output_format_version":"{version}","git_rev":"","rec_mechanism":"nccl_profiler_interface",'
            f'"dump_timestamp_us":{dump_us},"hostname":"{comm.hostname}","pid":{comm.pid}}}')


def _verbose(op: Collective) -> str:
    """``event_trace_sn`` and ``event_trace_ts``, numbered in callback order as the plugin numbers them.

    Collective start 1 and stop 2 (host enqueue), then every channel's kernel start, then per
    channel its stop record (the GPU timer arrives) and its stop event.
    """
    count = len(op.channels)
    sn_events = ",".join(
        f'{{"channel_id":{i},"kernel_start_sn":{3 + i},"kernel_stop_sn":{4 + count + 2 * i},'
        f'"kernel_record_sn":{3 + count + 2 * i}}}' for i in range(count))
    ts_events = ",".join(
        f'{{"channel_id":{i},"kernel_start_ts":{ch.start_us},"kernel_stop_ts":{ch.stop_us},'
        f'"kernel_record_ts":{ch.record_us}}}' for i, ch in enumerate(op.channels))
    return (f',"event_trace_sn":{{"coll_start_sn":1,"coll_stop_sn":2,"kernel_events":[{sn_events}]}}'
            f',"event_trace_ts":{{"coll_start_ts":{op.enqueue_us},"coll_stop_ts":{op.enqueue_us + 5},'
            f'"kernel_events":[{ts_events}]}}')


def coll_perf(comm: Comm, op: Collective, *, verbose: bool, algo_proto: tuple[str, str] | None = None) -> str:
    """The ``coll_perf`` object of one collective."""
    algo, bus = bandwidths(op.coll, op.size, comm.ranks, op.exec_us)
    extra = f'"coll_algo":"{algo_proto[0]}","coll_proto":"{algo_proto[1]}",' if algo_proto else ""
    return (f'{{"coll":"{op.coll}",{extra}"coll_sn":{op.sn},"coll_msg_size_bytes":{op.size},'
            f'"coll_exec_time_us":{op.exec_us},"coll_timing_source":"{op.timing_source}",'
            f'"coll_algobw_gbs":{_double(algo)},"coll_busbw_gbs":{_double(bus)}'
            f'{_verbose(op) if verbose else ""}}}')


def coll_line(comm: Comm, op: Collective, *, verbose: bool = False, version: str = "v4.0") -> str:
    """One self-contained record line (v4.0 to v4.3 layout), newline included."""
    return (f'{{"header":{_header(comm)},"metadata":{_metadata(comm, op.dump_us, version)},'
            f'"coll_perf":{coll_perf(comm, op, verbose=verbose)}}}\n')


def dump_stats_line(comm: Comm, dump_us: int, *, coll_records: int, coll_dropped_total: int = 0,
                    coll_dropped_since_last_dump: int = 0, version: str = "v4.4") -> str:
    """A ``dump_stats`` marker line (v4.1 and later), newline included."""
    return (f'{{"header":{_header(comm)},"metadata":{_metadata(comm, dump_us, version)},"dump_stats":{{'
            f'"coll_records":{coll_records},"coll_dropped_total":{coll_dropped_total},'
            f'"coll_dropped_since_last_dump":{coll_dropped_since_last_dump},'
            f'"p2p_records":0,"p2p_dropped_total":0,"p2p_dropped_since_last_dump":0}}}}\n')


def bare_coll_line(comm: Comm, op: Collective, *, algo_proto: tuple[str, str] = ("RING", "SIMPLE")) -> str:
    """A v4.4 record line after a marker: ``coll_perf`` only, newline included."""
    return f'{{"coll_perf":{coll_perf(comm, op, verbose=False, algo_proto=algo_proto)}}}\n'
