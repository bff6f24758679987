"""Inspector dump lines: fixtures written to the plugin's format parse to the values its source defines.

Expected figures come from the plugin's rules (``inspectorComputeCollBw``; begin and end from the
raw ``event_trace_ts`` numbers, read here with plain ``json``), never from the parser under test.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from chopper.inspector import (
    REJECTION_REASONS,
    SUPPORTED_VERSIONS,
    DumpStats,
    InspectorFormatError,
    InspectorRecord,
    RecordDecoder,
    parse_line,
    parse_record,
)
from tests.support.hazards import HazardOutcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "inspector"
RANKS = {41001: 0, 41002: 1}

# The plugin's own README (NVIDIA/nccl ext-profiler/inspector/README.md, "Output Example Verbose"),
# compacted the way json.cc writes it: an example of real output by the plugin's authors.
README_VERBOSE = (
    '{"header":{"id":"0xe62dedaa97644a","rank":4,"n_ranks":8,"nnodes":1},"metadata":{'
    '"inspector_output_format_version":"v4.0","git_rev":"9019a1912-dirty","rec_mechanism":"nccl_profiler_interface",'
    '"dump_timestamp_us":1752867229276385,"hostname":"example-hostname","pid":438776},"coll_perf":{'
    '"coll":"ReduceScatter","coll_sn":1231,"coll_msg_size_bytes":2147483648,"coll_exec_time_us":41057,'
    '"coll_timing_source":"kernel_gpu","coll_algobw_gbs":418.439467,"coll_busbw_gbs":366.134533,'
    '"event_trace_sn":{"coll_start_sn":1,"coll_stop_sn":2,"kernel_events":[{"channel_id":0,"kernel_start_sn":3,'
    '"kernel_stop_sn":48,"kernel_record_sn":47}]},"event_trace_ts":{"coll_start_ts":1752867229235059,'
    '"coll_stop_ts":1752867229235064,"kernel_events":[{"channel_id":0,"kernel_start_ts":1752867229235181,'
    '"kernel_stop_ts":1752867229275811,"kernel_record_ts":1752867229275811}]}}}'
)


def lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().split(b"\n") if line]


def decode_file(path: Path) -> list[InspectorRecord | DumpStats | None]:
    decoder = RecordDecoder()
    return [decoder.decode(parse_line(line)) for line in lines(path)]


def bus_factor(coll: str, ranks: int) -> tuple[int, float]:
    """(traffic multiple of the message size, bus factor) of inspectorComputeCollBw."""
    if coll == "AllReduce":
        return 1, 2 * (ranks - 1) / ranks
    if coll in ("AllGather", "ReduceScatter"):
        return ranks, (ranks - 1) / ranks
    return 1, 1.0


@pytest.mark.parametrize("mode", ["plain", "verbose"])
def test_a_two_rank_job_reads_as_the_plugin_defines_it(mode: str) -> None:
    by_rank: dict[int, list[InspectorRecord]] = {}
    for path in sorted((FIXTURES / mode).glob("*.log")):
        records = decode_file(path)
        assert all(isinstance(r, InspectorRecord) for r in records)
        for record, raw in zip(records, lines(path), strict=True):
            assert isinstance(record, InspectorRecord)
            obj = json.loads(raw)
            traffic, factor = bus_factor(record.collective, record.comm_ranks)
            # Bandwidths as the plugin computes them, to the six decimals it prints.
            assert record.algo_gbs == pytest.approx(traffic * record.bytes / 1e9 / record.exec_s, abs=1e-6)
            assert record.bus_gbs == pytest.approx(record.algo_gbs * factor, abs=1e-6)
            assert record.exec_s == obj["coll_perf"]["coll_exec_time_us"] / 1e6
            assert record.dump_ns == obj["metadata"]["dump_timestamp_us"] * 1000
            assert (record.hostname, record.comm_rank, record.comm_ranks) == ("node-a", RANKS[record.pid], 2)
            assert (record.timing_source, record.version, record.kind) == ("kernel_gpu", "v4.0", "coll")
            if mode == "plain":
                assert record.begin_ns is record.end_ns is None
            else:
                events = obj["coll_perf"]["event_trace_ts"]["kernel_events"]
                assert record.begin_ns == min(e["kernel_start_ts"] for e in events) * 1000
                assert record.end_ns == max(e["kernel_stop_ts"] for e in events) * 1000
                assert record.begin_ns < record.end_ns <= record.dump_ns
            by_rank.setdefault(record.comm_rank, []).append(record)
    assert sorted(by_rank) == [0, 1] and all(len(v) == 10 for v in by_rank.values())
    # Both ranks saw the same operations: per-type sequence numbers 1.. and equal sizes.
    ops = [[(r.collective, r.seq, r.bytes) for r in by_rank[rank]] for rank in (0, 1)]
    assert ops[0] == ops[1]
    assert [s for c, s, _ in ops[0] if c == "AllReduce"] == [1, 2, 3, 4]
    assert {c for c, _, _ in ops[0]} == {"AllGather", "ReduceScatter", "AllReduce"}


def test_verbose_and_plain_lines_differ_only_in_begin_and_end() -> None:
    plain = decode_file(FIXTURES / "plain" / "node-a-pid41001.log")
    verbose = decode_file(FIXTURES / "verbose" / "node-a-pid41001.log")
    for p, v in zip(plain, verbose, strict=True):
        assert isinstance(p, InspectorRecord) and isinstance(v, InspectorRecord)
        assert v.begin_ns is not None and v.end_ns is not None
        assert p == InspectorRecord(**{**{k: getattr(v, k) for k in v.__slots__}, "begin_ns": None, "end_ns": None})


def test_the_plugins_own_readme_example_parses() -> None:
    record = parse_record(parse_line(README_VERBOSE))
    assert (record.collective, record.seq, record.bytes, record.comm_rank, record.comm_ranks) == (
        "ReduceScatter", 1231, 2147483648, 4, 8)
    assert (record.begin_ns, record.end_ns) == (1752867229235181000, 1752867229275811000)
    # The host-observed interval (40.630 ms) is not the GPU time (41.057 ms): the plugin's clocks differ.
    assert record.exec_s == 0.041057
    assert (record.end_ns - record.begin_ns) / 1e9 == pytest.approx(0.040630)


def test_v4_4_lines_after_a_marker_inherit_its_header() -> None:
    stats, *records = decode_file(FIXTURES / "v4.4" / "node-a-pid41003.log")
    assert isinstance(stats, DumpStats)
    assert (stats.coll_records, stats.coll_dropped_since_last_dump, stats.context.comm_name) == (3, 5, "DP Group 0")
    assert len(records) == 3
    for record in records:
        assert isinstance(record, InspectorRecord)
        assert (record.pid, record.version, record.comm_name, record.algo, record.proto) == (
            41003, "v4.4", "DP Group 0", "RING", "SIMPLE")
        assert record.dump_ns == stats.context.dump_ns
    bare = parse_line(lines(FIXTURES / "v4.4" / "node-a-pid41003.log")[1])
    with pytest.raises(InspectorFormatError) as err:
        parse_record(bare)
    assert err.value.reason == "missing_context"


def test_p2p_and_proxy_lines() -> None:
    good = json.loads(lines(FIXTURES / "plain" / "node-a-pid41001.log")[0])
    perf = {"p2p": "Send", "p2p_sn": 7, "p2p_peer": 1, "p2p_msg_size_bytes": 1 << 20, "p2p_exec_time_us": 20,
            "p2p_timing_source": "kernel_gpu", "p2p_algobw_gbs": 52.428800, "p2p_busbw_gbs": 52.428800}
    record = parse_record({"header": good["header"], "metadata": good["metadata"], "p2p_perf": perf})
    assert (record.kind, record.collective, record.peer, record.exec_s) == ("p2p", "Send", 1, 20e-6)
    assert RecordDecoder().decode({"header": good["header"], "metadata": good["metadata"], "proxy_trace": {}}) is None


@pytest.mark.hazard(item=16, input="an Inspector line whose inspector_output_format_version is v5.0",
                    promise="refused naming the version and the versions read; the lines around it still read")
def test_an_unknown_version_is_refused_by_name(hazard: HazardOutcome) -> None:
    decoder = RecordDecoder()
    outcomes: list[str] = []
    for line in lines(FIXTURES / "unknown-version" / "node-a-pid41009.log"):
        try:
            outcomes.append(type(decoder.decode(parse_line(line))).__name__)
        except InspectorFormatError as exc:
            assert exc.reason == "unknown_version" and exc.version == "v5.0"
            assert "'v5.0'" in str(exc) and all(v in str(exc) for v in SUPPORTED_VERSIONS)
            assert "upgrade chopper-agent" in str(exc)
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[2] == "InspectorRecord"
    hazard.outcome = f"refused: {outcomes[1][:90]}...; the records before and after it read"


def _mutate(obj: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    copy = json.loads(json.dumps(obj))
    *parents, last = path.split(".")
    node = copy
    for key in parents:
        node = node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return copy


BAD_LINES: list[tuple[str, bytes | str, str]] = [
    ("torn record", b'{"header":{"id":"0x1","rank"', "not_json"),
    ("not UTF-8", b'{"coll_perf":"\xff\xfe"}', "not_json"),
    ("a NaN literal", b'{"coll_perf":NaN}', "not_json"),
    ("a JSON array", b"[1,2,3]", "not_an_object"),
    ("a bare number", b"42", "not_an_object"),
    ("no known section", b'{"hello":"world"}', "unknown_kind"),
]
BAD_FIELDS: list[tuple[str, str, object, str]] = [
    ("version missing", "metadata.inspector_output_format_version", KeyError, "missing_field"),
    ("version a number", "metadata.inspector_output_format_version", 4.0, "unknown_version"),
    ("header missing", "header", KeyError, "missing_field"),
    ("header a list", "header", [], "bad_field"),
    ("rank not below n_ranks", "header.rank", 2, "bad_field"),
    ("n_ranks zero", "header.n_ranks", 0, "bad_field"),
    ("rank a bool", "header.rank", True, "bad_field"),
    ("comm id not hex", "header.id", "comm-7", "bad_field"),
    ("pid zero", "metadata.pid", 0, "bad_field"),
    ("hostname with a newline", "metadata.hostname", "node\nb", "bad_field"),
    ("hostname empty", "metadata.hostname", "", "bad_field"),
    ("timestamp a string", "metadata.dump_timestamp_us", "1764662400", "bad_field"),
    ("timestamp negative", "metadata.dump_timestamp_us", -1, "bad_field"),
    ("sequence a float", "coll_perf.coll_sn", 3.0, "bad_field"),
    ("size negative", "coll_perf.coll_msg_size_bytes", -8, "bad_field"),
    ("size above 2^64", "coll_perf.coll_msg_size_bytes", 2**64, "bad_field"),
    ("exec time 'nan'", "coll_perf.coll_exec_time_us", "nan", "bad_field"),
    ("exec time missing", "coll_perf.coll_exec_time_us", KeyError, "missing_field"),
    ("bus bandwidth negative", "coll_perf.coll_busbw_gbs", -1.0, "bad_field"),
    ("timing source unknown", "coll_perf.coll_timing_source", "gpu", "bad_field"),
    ("operation name with spaces", "coll_perf.coll", "All Reduce", "bad_field"),
    ("event trace a list", "coll_perf.event_trace_ts", [], "bad_field"),
    ("kernel events not a list", "coll_perf.event_trace_ts.kernel_events", {}, "bad_field"),
    ("kernel events 5000 channels", "coll_perf.event_trace_ts.kernel_events", [{}] * 5000, "bad_field"),
    ("kernel start missing", "coll_perf.event_trace_ts.kernel_events",
     [{"kernel_stop_ts": 5}], "missing_field"),
]


@pytest.mark.hazard(item=16, input="Inspector lines that are torn, not UTF-8, not objects, or carry a field of the "
                    "wrong type or range (31 forms)",
                    promise="each is refused with a reason from REJECTION_REASONS and a message naming the field "
                    "and the fix; none is read as a record")
def test_bad_lines_are_refused_with_a_reason_and_the_field(hazard: HazardOutcome) -> None:
    good = json.loads(lines(FIXTURES / "verbose" / "node-a-pid41001.log")[0])
    cases = [(what, line, reason, None) for what, line, reason in BAD_LINES]
    cases += [(what, json.dumps(_mutate(good, path, value)), reason, path.rsplit(".", 1)[-1])
              for what, path, value, reason in BAD_FIELDS]
    for what, line, reason, field in cases:
        with pytest.raises(InspectorFormatError) as err:
            RecordDecoder().decode(parse_line(line))
        assert err.value.reason == reason, (what, str(err.value))
        assert reason in REJECTION_REASONS
        message = str(err.value)
        assert len(message) < 400, (what, message)
        if field is not None and reason != "unknown_version":
            assert field in message, (what, message)
        if reason not in ("unknown_version", "missing_context"):
            assert "NCCL_INSPECTOR_DUMP_DIR" in message, (what, message)  # the fix
    # What the plugin may legally write is kept: a NaN bandwidth is the string "nan" (json.cc).
    nan = parse_record(_mutate(good, "coll_perf.coll_algobw_gbs", "nan"))
    assert math.isnan(nan.algo_gbs)
    # A channel the plugin never saw (0) is left out; no usable channel leaves begin and end unknown.
    zero = parse_record(_mutate(good, "coll_perf.event_trace_ts.kernel_events",
                                [{"kernel_start_ts": 0, "kernel_stop_ts": 0}]))
    assert zero.begin_ns is zero.end_ns is None
    backwards = parse_record(_mutate(good, "coll_perf.event_trace_ts.kernel_events",
                                     [{"kernel_start_ts": 20, "kernel_stop_ts": 10}]))
    assert backwards.begin_ns is backwards.end_ns is None
    hazard.outcome = (f"{len(cases)} bad forms refused, reasons "
                      f"{sorted({c[2] for c in cases})}, each naming the field and the fix; "
                      "'nan' bandwidths and unseen channels read as the plugin means them")


def test_a_truncated_last_record_is_not_a_record() -> None:
    *whole, torn = lines(FIXTURES / "truncated" / "node-a-pid41010.log")
    assert len(whole) == 2 and all(isinstance(parse_record(parse_line(line)), InspectorRecord) for line in whole)
    with pytest.raises(InspectorFormatError) as err:
        parse_line(torn)
    assert err.value.reason == "not_json"


def test_bare_lines_after_a_refused_marker_are_not_given_to_an_older_one() -> None:
    marker, *bare = lines(FIXTURES / "v4.4" / "node-a-pid41003.log")
    other = json.loads(marker)
    other["header"]["id"], other["header"]["rank"] = "0xabc", 7     # a second communicator's marker, broken
    decoder = RecordDecoder()
    assert isinstance(decoder.decode(parse_line(marker)), DumpStats)
    assert isinstance(decoder.decode(parse_line(bare[0])), InspectorRecord)
    with pytest.raises(InspectorFormatError):
        decoder.decode(other)
    with pytest.raises(InspectorFormatError) as err:
        decoder.decode(parse_line(bare[1]))   # the broken marker's line: not the first communicator's
    assert err.value.reason == "missing_context"
    decoder.decode(parse_line(marker))
    decoder.forget()                          # the reader skipped bytes
    with pytest.raises(InspectorFormatError):
        decoder.decode(parse_line(bare[2]))


def test_the_committed_fixtures_are_what_their_writer_writes(tmp_path: Path) -> None:
    from tests.fixtures.inspector.write_dumps import main

    main(tmp_path)
    written = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*.log")}
    committed = {p.relative_to(FIXTURES): p.read_bytes() for p in FIXTURES.rglob("*.log")}
    assert written == committed
