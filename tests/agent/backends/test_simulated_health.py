"""The simulated backend's health counters: vendor counter sets, once-a-second readings, scheduled events."""
from __future__ import annotations

import itertools

import pytest

from agent.backends.sim_health import AGGREGATE_CORRECTED_MAX, counter_keys
from agent.backends.simulated import SimulatedBackend
from chopper.schema import ERROR_KINDS, ErrorCount, Sample

T0 = 1_700_000_000_000_000_000
S = 10**9
TICK = S // 10  # 10 Hz, the agent's default rate

Reading = dict[tuple[str, str, str], float]


def _run(b: SimulatedBackend, seconds: float, tick: int = TICK) -> list[list[Sample]]:
    b.open()
    return [b.sample(T0 + i * tick) for i in range(int(seconds * S) // tick + 1)]


def _readings(ticks: list[list[Sample]], gpu: int) -> list[tuple[float, Reading]]:
    """``(seconds after the first sample, counters)`` of every tick on which ``gpu`` reported health."""
    return [((t[gpu].ts_ns - T0) / S, {(e.kind, e.window, e.detail): e.value for e in t[gpu].errors})
            for t in ticks if t[gpu].errors]


@pytest.mark.parametrize(("model", "grown"), [
    ("H100", {("ecc_corrected", w, "total") for w in ("volatile", "aggregate")}),
    ("MI300X", {("ecc_corrected", "volatile", b) for b in ("umc", "total")}),
])
def test_an_ecc_burst_grows_on_its_gpu_at_its_time_and_nowhere_else(model: str, grown: set) -> None:
    ticks = _run(SimulatedBackend("n", model=model, gpus=8, seed=2, health_events=["3:ecc_corrected:20:50"]), 30)
    for g in range(8):
        readings = _readings(ticks, g)
        # Once a second of sample time, starting with the first sample; the other ticks carry none.
        assert [at for at, _ in readings] == [float(s) for s in range(31)]
        assert sum(1 for t in ticks if t[g].errors) == 31 and len(ticks) == 301
        base = readings[0][1]
        assert set(base) == set(counter_keys("nvidia" if model == "H100" else "amd"))
        for at, values in readings:
            moved = {k for k, v in values.items() if v != base[k]}
            if g != 3 or at <= 20:
                assert moved == set(), (g, at, moved)
            else:
                assert moved == grown, (at, moved)
                # A burst over 2 s: half of it after 1 s, all of it from 22 s on.
                assert {values[k] - base[k] for k in grown} == {25.0 if at == 21 else 50.0}
    assert not any(e.chip_wide for t in ticks for s in t for e in s.errors)  # whole chips


def test_counters_start_at_zero_but_nvidias_lifetime_corrected_count() -> None:
    for model in ("H100", "MI300X"):
        b = SimulatedBackend("n", model=model, gpus=8, seed=5)
        b.open()
        for s in b.sample(T0):
            for e in s.errors:
                assert e.kind in ERROR_KINDS
                if (e.kind, e.window) == ("ecc_corrected", "aggregate"):
                    assert 0 <= e.value < AGGREGATE_CORRECTED_MAX and e.value == int(e.value)
                else:
                    assert e.value == 0.0, e


def test_an_xid_appears_once_it_happened_and_an_ecc_xid_brings_its_uncorrected_error() -> None:
    b = SimulatedBackend("n", model="H100", gpus=4, health_events=["1:xid:30:1:79", "2:xid:10:2:48"])
    ticks = _run(b, 40)
    xid79 = [(at, r.get(("xid", "", "79"))) for at, r in _readings(ticks, 1)]
    assert all(v is None for at, v in xid79 if at <= 30) and all(v == 1.0 for at, v in xid79 if at > 30)
    assert not any(k[0].startswith("ecc_") and v for _, r in _readings(ticks, 1) for k, v in r.items()
                   if k != ("ecc_corrected", "aggregate", "total"))  # XID 79 (off the bus) is no ECC error
    last = _readings(ticks, 2)[-1][1]
    assert last[("xid", "", "48")] == 2.0  # a double-bit ECC error: the XID and the error itself
    assert last[("ecc_uncorrected", "volatile", "total")] == last[("ecc_uncorrected", "aggregate", "total")] == 2.0
    assert last[("remap_pending", "", "")] == 1.0  # the driver remaps the row at the next reset
    assert ("xid", "", "48") not in _readings(ticks, 2)[10][1]  # at 10 s exactly: not yet
    assert all(("xid", "", "79") not in r for g in (0, 2, 3) for _, r in _readings(ticks, g))


def test_states_and_gauges_follow_their_events() -> None:
    b = SimulatedBackend("n", model="MI300X", gpus=2, health_events=[
        "0:xgmi_error:5", "0:xgmi_error:8", "1:bad_pages:5:3:pending", "1:ecc_deferred:5:4:gfx", "0:pcie_nak_sent:5:7"])
    ticks = _run(b, 10)
    g0, g1 = _readings(ticks, 0), _readings(ticks, 1)
    assert [r[("xgmi_error", "", "")] for _, r in g0] == [0.0] * 6 + [1.0] * 3 + [2.0] * 2  # one, then several
    assert g0[-1][1][("pcie_nak_sent", "", "")] == 7.0
    assert g1[-1][1][("bad_pages", "", "pending")] == 3.0 and g1[-1][1][("bad_pages", "", "retired")] == 0.0
    assert g1[-1][1][("ecc_deferred", "volatile", "gfx")] == g1[-1][1][("ecc_deferred", "volatile", "total")] == 4.0
    h = _readings(_run(SimulatedBackend("n", model="H200", gpus=1, health_events=[
        "0:link_crc:2:9:data", "0:remap_failed:2", "0:remapped_rows:2:1:uncorrectable"]), 5), 0)[-1][1]
    assert (h[("link_crc", "", "data")], h[("link_crc", "", "flit")], h[("remap_failed", "", "")],
            h[("remapped_rows", "", "uncorrectable")]) == (9.0, 0.0, 1.0, 1.0)


def test_readings_are_at_most_once_a_second_at_any_sampling_pace() -> None:
    for tick in (S // 100, 300_000_000, 1_700_000_000):
        ticks = _run(SimulatedBackend("n", gpus=1), 12, tick=tick)
        at = [t[0].ts_ns for t in ticks if t[0].errors]
        gaps = [b - a for a, b in itertools.pairwise(at)]
        assert at[0] == T0 and min(gaps) >= S and max(gaps) < S + tick  # the first tick a second after the last
    b = SimulatedBackend("n", gpus=1)
    b.open()
    assert b.sample(T0)[0].errors and not b.sample(T0)[0].errors  # no time passed: no second reading
    b.open()  # a reopened backend starts over: cold, zero counters, a reading on its first sample
    assert b.sample(T0 + 5 * S)[0].errors


def test_same_events_same_counters_and_unchanged_counters_reuse_their_tuple() -> None:
    events = ["0:ecc_uncorrected:1:3", "1:pcie_replay:2:100"]
    runs = [_run(SimulatedBackend("n", model="H100", gpus=2, seed=9, health_events=events), 6) for _ in range(2)]
    assert [[s.errors for s in t] for t in runs[0]] == [[s.errors for s in t] for t in runs[1]]
    quiet = [t[0].errors for t in _run(SimulatedBackend("n", model="H100", gpus=1), 3) if t[0].errors]
    assert all(e is quiet[0] for e in quiet)  # nothing changed: the same tuple, not a new one per second
    assert isinstance(quiet[0][0], ErrorCount)


def test_a_bad_event_is_refused_naming_the_entry() -> None:
    with pytest.raises(ValueError, match=r"entry '1:xid:30:1:79' has KIND 'xid', which a simulated AMD GPU does not"):
        SimulatedBackend("n", model="MI300X", health_events=["1:xid:30:1:79"])
    with pytest.raises(ValueError, match=r"entry '9:pcie_replay:1' names GPU '9', not one of 0..1"):
        SimulatedBackend("n", model="H100", gpus=2, health_events=["9:pcie_replay:1"])
