"""Fuzz the Kineto trace reader (``chopper.trace.reader.read_trace``).

Property: for a trace whose events carry hostile values (wrong types in every field, numbers
beyond int64 or ±2**62 ns, NaN spelled as strings, missing keys, ``args`` that is not an
object), then perhaps cut short, flipped or padded byte-wise, gzipped or not (or garbage with
a gzip header), ``read_trace`` returns frames that are consistent (equal column lengths, int64
times, ``end_ns ≥ ts_ns``) or raises ``TraceError`` whose message starts with the file's path.
"""
from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from chopper.trace.reader import TraceError, read_trace
from tests.support.strategies import edit, fuzz

ROOT = Path(tempfile.mkdtemp(prefix="chopper-fuzz-traces-"))

_hostile = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e300, -1e300, 2**62, 2.5e15, -1, "1", "0x10", "9" * 40, "NaN", [], {}, [1, 2], {"a": 1}]),
    st.text(max_size=10),
)
_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8)),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                   max_size=3), max_leaves=8)


@st.composite
def _event(draw: st.DrawFn) -> dict[str, Any]:
    """A plausible Kineto event (kernel, runtime, cpu_op, annotation, flow), some fields made hostile."""
    cat = draw(st.sampled_from(["kernel", "gpu_memcpy", "cuda_runtime", "cpu_op", "user_annotation",
                                "gpu_user_annotation", "cuda_sync", "ac2g", "fwdbwd", "python_function"]))
    flow = cat in ("ac2g", "fwdbwd")
    event: dict[str, Any] = {
        "ph": draw(st.sampled_from(["s", "f"])) if flow else "X", "cat": cat,
        "name": draw(st.sampled_from(["ampere_sgemm", "ncclKernel_AllReduce", "ProfilerStep#1", "aten::mm",
                                      "hipLaunchKernel", "cudaLaunchKernel", "Cijk_Ailk"])),
        "pid": draw(st.integers(0, 3)), "tid": draw(st.integers(0, 9)),
        "ts": draw(st.one_of(st.integers(0, 10**7), st.floats(0, 1e7))),
        "dur": draw(st.integers(0, 10**4)),
        "args": {"correlation": draw(st.integers(0, 50)), "device": 0, "stream": 7, "External id": 3},
    }
    if flow:
        event["id"] = draw(st.integers(0, 50))
    for key in draw(st.lists(st.sampled_from(["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id"]),
                             max_size=3)):
        if draw(st.booleans()):
            event.pop(key, None)
        else:
            event[key] = draw(_hostile)
    if draw(st.booleans()):
        event["args"] = {k: draw(_hostile) for k in draw(st.lists(
            st.sampled_from(["correlation", "device", "stream", "External id"]), max_size=3))}
    return event


@st.composite
def _trace_bytes(draw: st.DrawFn) -> tuple[str, bytes]:
    """A file name and its bytes (module docstring)."""
    top: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(["deviceProperties", "distributedInfo", "baseTimeNanoseconds",
                                              "traceName", "schemaVersion"]), max_size=3, unique=True)):
        top[key] = draw(st.one_of(_hostile, _json, st.just([{"name": "AMD Instinct MI250X"}]),
                                  st.just({"rank": 3, "world_size": 8})))
    events = draw(st.lists(st.one_of(_event(), _json), max_size=12))
    tail = draw(st.booleans())  # metadata after the events, as some exporters write it
    text = json.dumps({"traceEvents": events, **top} if tail else {**top, "traceEvents": events})
    data = text.encode()
    for _ in range(draw(st.integers(0, 2))):
        data = edit(data, draw(st.sampled_from(["cut", "flip", "insert"])), draw(st.integers(0, len(data))),
                    draw(st.binary(min_size=1, max_size=4)))
    form = draw(st.sampled_from(["json", "gz", "gz_cut", "gz_garbage"]))
    if form == "json":
        return "rank1.json", bytes(data)
    packed = gzip.compress(bytes(data))
    if form == "gz_cut":
        packed = packed[:draw(st.integers(0, len(packed)))]
    elif form == "gz_garbage":
        packed = packed[:10] + draw(st.binary(max_size=32))
    return "rank1.json.gz", packed


@fuzz(300, timeout_s=120)
@given(_trace_bytes(), st.booleans())
@example(("t.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "args": "x"}]}'), True)  # args text
@example(("t.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "1", "dur": 1}]}'), True)  # ts text
@example(("t.json", b'{"traceEvents": [{"ph": "X", "cat": ["kernel"], "ts": 1}]}'), True)  # unhashable cat
@example(("t.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1e300, "dur": 1}]}'), True)  # huge ts
@example(("t.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "args": {"correlation": "'
          + b"9" * 40 + b'"}}]}'), True)  # id beyond int64
@example(("t.json", b'{"deviceProperties": 5, "traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1}]}'), True)
@example(("t.json", b'{"baseTimeNanoseconds": 9223372036854775807, "traceEvents": [{"ph": "X", "cat": "kernel",'
          b' "ts": 1, "dur": 1}]}'), True)  # base + ts beyond int64
def test_trace_reads_or_names_the_file(case: tuple[str, bytes], require_gpu: bool) -> None:
    name, data = case
    path = Path(tempfile.mkdtemp(dir=ROOT)) / name
    path.write_bytes(data)
    try:
        trace = read_trace(path, require_gpu)
    except TraceError as exc:
        assert str(exc).startswith(f"{path}: ") and len(str(exc)) > len(f"{path}: ") + 10
        return
    for frame in (trace.kernel_columns, trace.runtime_columns, trace.cpu_op_columns, trace.gpu_annotation_columns,
                  trace.flow_columns, trace.gpu_sync_columns):
        lengths = {len(values) for values in frame.data.values()}
        assert len(lengths) == 1, lengths
        assert frame.data["ts_ns"].dtype == np.int64
        if "end_ns" in frame.data:
            assert (frame.data["end_ns"] >= frame.data["ts_ns"]).all()
        for column, vocab in frame.vocab.items():
            codes = frame.data[column]
            assert not len(codes) or (codes.min() >= 0 and codes.max() < len(vocab))
    assert trace.rank >= 0 and trace.device_type in ("cuda", "rocm")
