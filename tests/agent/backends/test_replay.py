"""The replay backend: pacing on an injected clock, speed, end of run, looping, bad run dirs."""
from __future__ import annotations

from pathlib import Path

import pytest

from agent.backends.base import Backend, BackendError, BackendUnavailable
from agent.backends.replay import ReplayBackend
from chopper.runs.rundir import RunDirError, read_run, write_run
from chopper.schema import DeviceInfo, ErrorCount, LinkBytes, Sample

REC0 = 1_600_000_000_000_000_000  # recorded clock
LIVE = 1_800_000_000_000_000_000  # live clock
MS = 1_000_000


def _record(path: Path, nodes: tuple[str, ...] = ("rec-node",)) -> Path:
    """Two GPUs sampled every 100 ms for 1 s (11 ticks); GPU 1 lags GPU 0 by 1 ms."""
    devices = [DeviceInfo(n, g, "amd", "AMD Instinct MI300X", f"{n}-u{g}", 2100.0, 1.3e15, 2**30, 750.0)
               for n in nodes for g in range(2)]
    samples = [Sample(REC0 + i * 100 * MS + g * MS, n, g, gfx_clock_mhz=2000.0 + i, busy_ratio=0.5,
                      power_w=500.0, energy_j=50.0 * i + 1000.0 * g, link_tx_bytes=1e6 * i,
                      throttle_power_s=0.01 * i)
               for i in range(11) for n in nodes for g in range(2)]
    return write_run(path, devices, samples, [])


def test_open_relabels_node_and_keeps_recorded_identity(tmp_path: Path) -> None:
    b = ReplayBackend("live-node", _record(tmp_path / "run"))
    assert isinstance(b, Backend) and b.name == "replay"
    devs = b.open()
    assert [(d.node, d.gpu, d.uuid, d.vendor) for d in devs] == [
        ("live-node", 0, "rec-node-u0", "amd"), ("live-node", 1, "rec-node-u1", "amd")]


def test_pacing_follows_injected_clock(tmp_path: Path) -> None:
    b = ReplayBackend("live", _record(tmp_path / "run"))
    b.open()
    first = b.sample(LIVE)  # anchors; only GPU 0's first sample has offset 0
    assert [(s.ts_ns, s.gpu, s.node) for s in first] == [(LIVE, 0, "live")]
    assert b.sample(LIVE + MS // 2) == []
    s = b.sample(LIVE + MS)
    assert [(x.ts_ns, x.gpu) for x in s] == [(LIVE + MS, 1)]
    assert s[0].energy_j == 1000.0  # cumulative counters as recorded
    s = b.sample(LIVE + 250 * MS)
    assert [(x.ts_ns - LIVE, x.gpu) for x in s] == [
        (100 * MS, 0), (101 * MS, 1), (200 * MS, 0), (201 * MS, 1)]
    assert [x.gfx_clock_mhz for x in s] == [2001.0, 2001.0, 2002.0, 2002.0]
    assert not b.finished
    s = b.sample(LIVE + 1000 * MS)
    assert [x.ts_ns - LIVE for x in s] == [300 * MS, 301 * MS, 400 * MS, 401 * MS, 500 * MS, 501 * MS,
                                           600 * MS, 601 * MS, 700 * MS, 701 * MS, 800 * MS, 801 * MS,
                                           900 * MS, 901 * MS, 1000 * MS]
    assert not b.finished  # GPU 1's last sample is at +1001 ms
    s = b.sample(LIVE + 1001 * MS)
    assert [(x.ts_ns - LIVE, x.gpu, x.energy_j) for x in s] == [(1001 * MS, 1, 1500.0)]
    assert b.finished
    assert b.sample(LIVE + 5000 * MS) == []
    assert b.sample(LIVE + 9000 * MS) == []


def test_speed_ten_times(tmp_path: Path) -> None:
    b = ReplayBackend("live", _record(tmp_path / "run"), speed=10)
    b.open()
    assert len(b.sample(LIVE)) == 1
    s = b.sample(LIVE + 50 * MS)  # 500 recorded ms
    assert [(x.ts_ns - LIVE, x.gpu) for x in s][-2:] == [(40 * MS + 100_000, 1), (50 * MS, 0)]
    assert len(s) == 10  # offsets 1, 100, 101, ..., 401, 500 ms
    rest = b.sample(LIVE + 101 * MS)
    assert rest[-1].ts_ns == LIVE + 100 * MS + 100_000
    assert b.finished


def test_loop_restarts_with_continuing_counters(tmp_path: Path) -> None:
    b = ReplayBackend("live", _record(tmp_path / "run"), loop=True)
    b.open()
    first = b.sample(LIVE) + b.sample(LIVE + 1001 * MS)
    assert len(first) == 22 and not b.finished
    # The next pass starts one recorded interval (100 ms) after the last recorded sample.
    assert b.sample(LIVE + 1050 * MS) == []
    again = b.sample(LIVE + 1101 * MS)
    assert [(x.ts_ns - LIVE, x.gpu) for x in again] == [(1101 * MS, 0)]
    assert again[0].energy_j == 500.0  # 0 + one pass of growth (500 J)
    assert again[0].gfx_clock_mhz == 2000.0  # interval means are not shifted
    all_rows = first + again + b.sample(LIVE + 4000 * MS)
    for g in (0, 1):
        energy = [x.energy_j for x in all_rows if x.gpu == g]
        ts = [x.ts_ns for x in all_rows if x.gpu == g]
        assert energy == sorted(energy)  # never backwards across the wrap
        assert ts == sorted(ts) and len(set(ts)) == len(ts)
    assert not b.finished


def test_bad_speed() -> None:
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"replay speed must be a finite number above 0"):
            ReplayBackend("n", "/nowhere", speed=bad)


def test_bad_run_dir_error_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match=r"replay: cannot use recorded run: .*does not exist"):
        ReplayBackend("n", tmp_path / "missing").open()
    run = _record(tmp_path / "run")
    (run / "samples.parquet").unlink()
    expected = r"no samples table: expected samples\.parquet or samples\.csv"
    with pytest.raises(BackendUnavailable, match=expected) as info:
        ReplayBackend("n", run).open()
    assert isinstance(info.value.__cause__, RunDirError)  # the original stays reachable


def test_several_recorded_nodes_need_a_choice(tmp_path: Path) -> None:
    run = _record(tmp_path / "run", nodes=("a", "b"))
    with pytest.raises(BackendUnavailable, match=r"holds nodes a, b; set recorded_node"):
        ReplayBackend("n", run).open()
    with pytest.raises(BackendUnavailable, match=r"recorded_node 'c' is not in"):
        ReplayBackend("n", run, recorded_node="c").open()
    b = ReplayBackend("n", run, recorded_node="b")
    assert [d.uuid for d in b.open()] == ["b-u0", "b-u1"]
    b.sample(LIVE)
    assert [s.gpu for s in b.sample(LIVE + 10**10)] == [1] + [0, 1] * 10


def test_sample_before_open(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"before open"):
        ReplayBackend("n", tmp_path).sample(LIVE)


def _record_links(path: Path) -> Path:
    """The run of ``_record`` with two NVLinks per GPU: at row i, link k has sent (k + 1)·i MB, received i MB."""
    recorded = read_run(_record(path))
    samples = [Sample(int(r.ts_ns), r.node, int(r.gpu), *(float(v) for v in r[3:]),
                      links=tuple(LinkBytes(k, (k + 1) * 1e6 * i, 1e6 * i) for k in range(2)))
               for i, r in enumerate(recorded.samples.itertuples(index=False))]
    return write_run(path, recorded.devices, samples, [])


def test_recorded_links_replay_with_their_samples_and_grow_per_cycle(tmp_path: Path) -> None:
    run = _record_links(tmp_path / "run")
    b = ReplayBackend("live", run, loop=True)
    b.open()
    first = b.sample(LIVE)[0]
    assert first.links == (LinkBytes(0, 0.0, 0.0), LinkBytes(1, 0.0, 0.0))
    cycle = b.sample(LIVE + 1001 * MS)
    last = cycle[-1]  # GPU 1's 11th sample, row 21 of the recording
    assert last.links == (LinkBytes(0, 21e6, 21e6), LinkBytes(1, 42e6, 21e6))
    again = [s for s in b.sample(LIVE + 2102 * MS) if s.gpu == 1][-1]  # the same sample, one cycle on
    assert again.links == (LinkBytes(0, 21e6 + 20e6, 21e6 + 20e6), LinkBytes(1, 42e6 + 40e6, 21e6 + 20e6))


def test_a_run_without_links_replays_empty_links(tmp_path: Path) -> None:
    b = ReplayBackend("live", _record(tmp_path / "run"))
    b.open()
    assert all(s.links == () for s in b.sample(LIVE + 2000 * MS))


def _record_health(path: Path) -> Path:
    """The run of ``_record`` with health read every 500 ms: corrected ECC errors grow by 3 per reading,
    a remap is pending from the second reading on; the device rows name a CPX partition."""
    recorded = read_run(_record(path))
    samples = []
    for i, r in enumerate(recorded.samples.itertuples(index=False)):
        tick = i // 2
        errors = (ErrorCount("ecc_corrected", "volatile", "umc", 3.0 * (tick // 5)),
                  ErrorCount("remap_pending", "", "", float(tick >= 5), chip_wide=True)) if tick % 5 == 0 else ()
        samples.append(Sample(int(r.ts_ns), r.node, int(r.gpu), *(float(v) for v in r[3:]), errors=errors))
    devices = recorded.devices.assign(partition="CPX", memory_partition="NPS4", chip_uuid="chip-0",
                                      compute_share=0.125, pci_bus_id="0000:0c:00.0")
    return write_run(path, devices, samples, [])


def test_recorded_health_replays_with_its_samples_and_counters_grow_per_cycle(tmp_path: Path) -> None:
    b = ReplayBackend("live", _record_health(tmp_path / "run"), loop=True)
    [dev, _] = b.open()
    assert (dev.partition, dev.memory_partition, dev.chip_uuid, dev.compute_share, dev.pci_bus_id) == (
        "CPX", "NPS4", "chip-0", 0.125, "0000:0c:00.0")
    cycle = b.sample(LIVE) + b.sample(LIVE + 1001 * MS)
    read = [s for s in cycle if s.errors]
    assert [(s.ts_ns - LIVE, s.gpu) for s in read] == [(0, 0), (MS, 1), (500 * MS, 0), (501 * MS, 1),
                                                     (1000 * MS, 0), (1001 * MS, 1)]
    assert read[-1].errors == (ErrorCount("ecc_corrected", "volatile", "umc", 6.0),
                               ErrorCount("remap_pending", "", "", 1.0, chip_wide=True))
    again = [s for s in b.sample(LIVE + 2102 * MS) if s.gpu == 1 and s.errors][-1]  # one cycle on
    # The counter grew by its recorded span (6); the state replays as recorded.
    assert again.errors == (ErrorCount("ecc_corrected", "volatile", "umc", 12.0),
                            ErrorCount("remap_pending", "", "", 1.0, chip_wide=True))
