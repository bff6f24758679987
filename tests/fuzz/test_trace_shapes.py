"""The trace reader's time and memory grow at most linearly with the input, whatever its shape.

Values are fuzzed elsewhere (``test_traces.py``); here the *shape* of a trace grows: nesting
depth, name length (plain and full of escapes), the number of distinct names, of events, of
nested events and of metadata entries before ``traceEvents``. Each shape is written at a size
``N`` and ``4N`` and run through what ``chopper trace`` does before its vectorised analyses
(read, hierarchy, top kernels: where names are parsed, classed and shortened). Measured in the
same run, as ratios: the peak of Python allocations (``tracemalloc``, which numpy reports to)
and the least of five interleaved timings. Linear work gives ratios near 4 and quadratic work
near 16; the bounds are 6 (memory) and 8 (time), never a wall-clock limit.

The bound on depth is also checked where it matters most, through the CLI in a child process
whose address space is capped: a 180-byte ``.json.gz`` nested 40,000 deep, which once took 4 GB.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chopper.trace import TraceError, load_traces
from chopper.trace.analyses.top_kernels import top_kernels
from chopper.trace.classify import _CACHE
from chopper.trace.hierarchy import build
from chopper.trace.nesting import MAX_DEPTH, NestingGuard, TooDeep
from tests.support.strategies import fuzz

REPO = Path(__file__).resolve().parents[2]


def _kernel(i: int, name: str = "ampere_sgemm_128x64", args: Any = None) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 10 * i, "dur": 5,
            "args": {"correlation": i, "device": 0, "stream": 7} if args is None else args}


def _trace(events: list[dict[str, Any]], **head: Any) -> bytes:
    return json.dumps({**head, "traceEvents": [_kernel(0), *events]}).encode()


def _nested(depth: int) -> bytes:
    """One kernel whose ``args`` is a list nested ``depth`` deep (beyond the bound: refused)."""
    return (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1, "args": '
            + b"[" * depth + b"]" * depth + b"}]}")


SHAPES: dict[str, tuple[Callable[[int], bytes], int]] = {
    # shape: (trace of size n, n)
    "nesting depth (refused)": (_nested, 4_000),
    "name length": (lambda n: _trace([_kernel(1, "cudnn" * (n // 5))]), 50_000),
    "name length, escapes": (lambda n: _trace([_kernel(1, '\\"[{' * (n // 4))]), 50_000),
    "distinct names": (lambda n: _trace([_kernel(i, f"conv_{i}_kernel") for i in range(n)]), 400),
    "events": (lambda n: _trace([_kernel(i) for i in range(n)]), 600),
    "events nested to the bound": (lambda n: _trace([_kernel(i, args=json.loads(
        "[" * (MAX_DEPTH - 4) + "]" * (MAX_DEPTH - 4))) for i in range(n)]), 250),
    "metadata before traceEvents": (lambda n: _trace([], deviceProperties=[
        {"id": i, "name": "NVIDIA A100", "totalGlobalMem": 85e9} for i in range(n)]), 2_000),
}


def _work(path: Path) -> None:
    """What ``chopper trace PATH`` does before its vectorised analyses: read, class and link every
    kernel (the hierarchy), rank and shorten every name (top kernels)."""
    _CACHE.clear()  # each run classifies its names afresh
    with contextlib.suppress(TraceError):
        for trace in load_traces([path]):
            top_kernels(build(trace), n=None)


def _seconds(path: Path) -> float:
    start = time.perf_counter()
    _work(path)
    return time.perf_counter() - start


def _peak_bytes(path: Path) -> int:
    tracemalloc.start()
    try:
        _work(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.hazard(item=13, input="traces growing in one shape at a time, N and 4N: nesting depth, name length, "
                    "escapes, distinct names, events, nested events, head metadata",
                    promise="time and memory grow at most linearly with the input, whatever its shape")
@pytest.mark.slow
@pytest.mark.parametrize("shape", list(SHAPES))
def test_work_grows_linearly_with_each_shape(shape: str, tmp_path: Path, hazard: Any) -> None:
    make, n = SHAPES[shape]
    paths = []
    for size in (n, 4 * n):
        path = tmp_path / f"size{size}.json"
        path.write_bytes(make(size))
        paths.append(path)
    _work(paths[0])  # warm-up: imports and first-use caches
    times: list[list[float]] = [[], []]
    for repeat in range(5):  # interleaved, so that a busy moment of the machine hits both sizes
        for i in (0, 1) if repeat % 2 else (1, 0):
            times[i].append(_seconds(paths[i]))
    peaks = [_peak_bytes(p) for p in paths]
    time_ratio = min(times[1]) / min(times[0])
    memory_ratio = peaks[1] / peaks[0]
    hazard.outcome = (f"{shape}: 4x the input ({paths[0].stat().st_size:,} → {paths[1].stat().st_size:,} bytes) took "
                      f"{time_ratio:.2f}x the time and {memory_ratio:.2f}x the peak memory "
                      f"({peaks[0] / 2**20:.1f} → {peaks[1] / 2**20:.1f} MiB)")
    print(hazard.outcome)
    assert memory_ratio < 6, hazard.outcome
    assert time_ratio < 8, hazard.outcome


CLI_UNDER_LIMIT = textwrap.dedent("""
    import resource, sys
    from chopper.cli import main
    import chopper.trace.report, pandas  # what the command imports, mapped before the cap

    def mapped() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * resource.getpagesize()

    limit = mapped() + (256 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.exit(main(["trace", sys.argv[1]]))
""")


@pytest.mark.hazard(item=13, input="a 180-byte .json.gz nested 40,000 deep, through `chopper trace`",
                    promise="refused with a message naming the file and the cause, within 256 MiB more than the "
                    "command maps at start (it once took 4 GB)")
@pytest.mark.timeout(60)
def test_deep_nesting_is_refused_by_the_cli_within_a_memory_cap(tmp_path: Path, hazard: Any) -> None:
    path = tmp_path / "deep_rank0.json.gz"
    path.write_bytes(gzip.compress(_nested(40_000)))
    done = subprocess.run([sys.executable, "-c", CLI_UNDER_LIMIT, str(path)], capture_output=True, text=True,
                          timeout=50, cwd=REPO)
    hazard.outcome = (f"{path.stat().st_size}-byte file: exit {done.returncode} under RLIMIT_AS of mapped + 256 MiB; "
                      f"stderr: {done.stderr.strip()[:160]}")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"chopper trace: {path}: JSON nested" in done.stderr and "more than the 64 levels" in done.stderr
    assert "Traceback" not in done.stderr


def _reference(data: bytes) -> int:
    """Deepest nesting of JSON text, one character at a time (strings and escapes skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in data.decode():
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


_text = st.text(alphabet='ab"\\[]{}\n', max_size=6)
_json = st.recursive(st.one_of(st.none(), st.integers(), _text),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                     max_leaves=30)


@fuzz(300, timeout_s=60)
@given(_json, st.integers(1, 9))
def test_nesting_guard_measures_what_a_parser_would(value: Any, chunk: int) -> None:
    """Whatever the chunking, strings full of quotes, backslashes and brackets: the exact depth."""
    data = json.dumps(value).encode()
    deepest = _reference(data)
    at_bound = NestingGuard(io.BytesIO(data), limit=deepest)
    while at_bound.read(chunk):
        pass
    assert at_bound.depth == 0
    if deepest:
        below = NestingGuard(io.BytesIO(data), limit=deepest - 1)
        with pytest.raises(TooDeep):
            while below.read(chunk):
                pass
