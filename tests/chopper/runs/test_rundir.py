"""Recorded run directories: round trip, CSV input, and a clear error for every bad input."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from chopper.attribution import AttributionError, attribute
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.runs.rundir import _INT_COLUMNS, BOUNDS, COLLECTIVE_COLUMNS, RunDirError, read_run, write_run
from chopper.schema import (
    DEVICE_COLUMNS,
    ERROR_COLUMNS,
    LINK_COLUMNS,
    MARKER_COLUMNS,
    SAMPLE_COLUMNS,
    DeviceInfo,
    ErrorCount,
    LinkBytes,
    MarkerKind,
    Sample,
)
from tests.support.hazards import HazardOutcome

T0 = 1_700_000_000_123_456_789  # above 2**53: must survive without a float round trip


def _devices() -> list[DeviceInfo]:
    return [DeviceInfo("n1", g, "amd", "AMD Instinct MI300X", f"uuid-{g}", 2100.0, 1.3074e15,
                       192 * 1024**3, 750.0) for g in range(2)]


def _samples(links: bool = False, errors: bool = False) -> list[Sample]:
    """Three ticks of two GPUs; with ``links``, each GPU has two XGMI links carrying 1 and 2 MB per tick;
    with ``errors``, each GPU reports UMC corrected ECC errors growing by one per tick and its bad pages."""
    out = []
    for i in range(3):
        for g in range(2):
            per_link = (LinkBytes(0, 1e6 * i, 0.5e6 * i), LinkBytes(1, 2e6 * i, 1e6 * i)) if links else ()
            health = (ErrorCount("ecc_corrected", "volatile", "umc", float(i)),
                      ErrorCount("bad_pages", "", "", 2.0, chip_wide=True)) if errors else ()
            out.append(Sample(T0 + i * 10_000_000 + g, "n1", g, gfx_clock_mhz=2000.0 - g, busy_ratio=0.5,
                              power_w=600.0, energy_j=6.0 * i, temp_c=70.0, link_tx_bytes=3e6 * i,
                              link_rx_bytes=1.5e6 * i, links=per_link, errors=health))
    return out


def _markers() -> list[dict]:
    return [
        dict(ts_ns=T0, job="j", node="n1", rank=0, gpu=0, kind=MarkerKind.STEP_BEGIN, step=1, name="",
             flops=np.nan, tokens=np.nan, bytes=np.nan),
        dict(ts_ns=T0 + 5, job="j", node="n1", rank=0, gpu=0, kind="collective_begin", step=1,
             name="allreduce", flops=np.nan, tokens=np.nan, bytes=1e6),
        dict(ts_ns=T0 + 9, job="j", node="n1", rank=0, gpu=0, kind=2, step=1, name="",
             flops=1e15, tokens=4096.0, bytes=np.nan),
    ]


def _collectives() -> list[dict]:
    """Two Inspector records of rank 0 as the agent sends them (values as in CollectiveRecord)."""
    row = dict(job="j", node="n1", rank=0, gpu=0, collective="AllReduce", begin_ns=T0 + 5, end_ns=T0 + 8,
               placed=True, exec_s=3e-9, timing_source="kernel_gpu", bytes=2**40 + 1, algo_bandwidth_gbs=1.5,
               bus_bandwidth_gbs=2.625, comm_id="0x7f3a", comm_rank=0, comm_ranks=8, comm_nodes=1, seq=41, pid=4242,
               format_version="v4.0")
    return [row, {**row, "begin_ns": T0 + 1, "end_ns": T0 + 2, "placed": False, "seq": 40}]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run", _devices(), _samples(), _markers())


def test_round_trip_keeps_values_and_exact_columns(run_dir: Path) -> None:
    assert sorted(p.name for p in run_dir.iterdir()) == ["devices.parquet", "markers.parquet",
                                                         "samples.parquet"]
    run = read_run(run_dir)
    assert tuple(run.devices.columns) == DEVICE_COLUMNS
    assert tuple(run.samples.columns) == SAMPLE_COLUMNS
    assert tuple(run.markers.columns) == MARKER_COLUMNS
    assert run.devices["memory_bytes"].tolist() == [192 * 1024**3] * 2
    assert run.samples["ts_ns"].dtype == np.int64
    assert int(run.samples["ts_ns"].iloc[1]) == T0 + 1
    assert run.samples["gfx_clock_mhz"].tolist()[:2] == [2000.0, 1999.0]
    assert np.isnan(run.samples["matrix_ratio"]).all()
    assert run.markers["kind"].tolist() == ["step_begin", "collective_begin", "step_end"]
    assert run.markers["bytes"].iloc[1] == 1e6
    # Writing what was read gives the same tables.
    again = read_run(write_run(run_dir.parent / "copy", run.devices, run.samples, run.markers))
    pd.testing.assert_frame_equal(again.samples, run.samples)
    pd.testing.assert_frame_equal(again.markers, run.markers)


def test_csv_input_with_integer_kinds(run_dir: Path, tmp_path: Path) -> None:
    run = read_run(run_dir)
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    run.devices.to_csv(csv_dir / "devices.csv", index=False)
    run.samples.to_csv(csv_dir / "samples.csv", index=False)
    markers = run.markers.copy()
    markers["kind"] = [int(MarkerKind[k.upper()]) for k in markers["kind"]]
    markers.to_csv(csv_dir / "markers.csv", index=False)
    back = read_run(csv_dir)
    assert back.markers["kind"].tolist() == ["step_begin", "collective_begin", "step_end"]
    assert int(back.samples["ts_ns"].iloc[5]) == T0 + 20_000_001
    assert back.devices["uuid"].tolist() == ["uuid-0", "uuid-1"]


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match=r"does not exist"):
        read_run(tmp_path / "nope")


def test_missing_table_names_both_files(run_dir: Path) -> None:
    (run_dir / "markers.parquet").unlink()
    with pytest.raises(RunDirError, match=r"no markers table: expected markers\.parquet or markers\.csv"):
        read_run(run_dir)


def test_missing_and_extra_columns_are_named(run_dir: Path) -> None:
    samples = pd.read_parquet(run_dir / "samples.parquet").drop(columns=["temp_c"])
    samples["fan_rpm"] = 1.0
    samples.to_parquet(run_dir / "samples.parquet")
    with pytest.raises(RunDirError, match=r"missing column\(s\) temp_c; unexpected column\(s\) fan_rpm"):
        read_run(run_dir)


def test_non_numeric_timestamp(run_dir: Path) -> None:
    samples = pd.read_parquet(run_dir / "samples.parquet")
    samples["ts_ns"] = samples["ts_ns"].astype(str)
    samples.loc[2, "ts_ns"] = "yesterday"
    samples.to_csv(run_dir / "samples.csv", index=False)
    (run_dir / "samples.parquet").unlink()
    with pytest.raises(RunDirError, match=r"samples\.csv.*column ts_ns has non-numeric value 'yesterday'"):
        read_run(run_dir)


def test_fractional_or_empty_integer_column(run_dir: Path) -> None:
    devices = pd.read_parquet(run_dir / "devices.parquet")
    devices["gpu"] = [0.0, np.nan]
    devices.to_parquet(run_dir / "devices.parquet")
    with pytest.raises(RunDirError, match=r"column gpu must hold whole numbers"):
        read_run(run_dir)


def test_non_numeric_float_column(run_dir: Path) -> None:
    with pytest.raises(RunDirError, match=r"column power_w has non-numeric value 'hot'"):
        write_run(run_dir, _devices(), [Sample(T0, "n1", 0, power_w="hot")], [])  # type: ignore[arg-type]


def test_unknown_marker_kind(run_dir: Path) -> None:
    markers = pd.read_parquet(run_dir / "markers.parquet")
    markers.loc[1, "kind"] = "coffee_break"
    markers.to_parquet(run_dir / "markers.parquet")
    with pytest.raises(RunDirError, match=r"unknown marker kind 'coffee_break'; use one of step_begin"):
        read_run(run_dir)
    markers.loc[1, "kind"] = "7"
    markers.to_parquet(run_dir / "markers.parquet")
    with pytest.raises(RunDirError, match=r"unknown marker kind '7'"):
        read_run(run_dir)


def test_samples_for_unknown_gpu(run_dir: Path) -> None:
    with pytest.raises(RunDirError, match=r"not in the devices table: node=n1 gpu=5"):
        write_run(run_dir, _devices(), [*_samples(), Sample(T0, "n1", 5)], _markers())
    samples = pd.read_parquet(run_dir / "samples.parquet")
    samples.loc[0, "node"] = "other"
    samples.to_parquet(run_dir / "samples.parquet")
    with pytest.raises(RunDirError, match=r"node=other gpu=0"):
        read_run(run_dir)


def test_corrupt_file(run_dir: Path) -> None:
    (run_dir / "devices.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(RunDirError, match=r"devices\.parquet.*unreadable or corrupt"):
        read_run(run_dir)


def test_empty_csv_is_corrupt(run_dir: Path) -> None:
    (run_dir / "markers.parquet").unlink()
    (run_dir / "markers.csv").write_text("")
    with pytest.raises(RunDirError, match=r"markers\.csv.*unreadable or corrupt"):
        read_run(run_dir)


def test_empty_markers_table_is_fine(tmp_path: Path) -> None:
    run = read_run(write_run(tmp_path / "r", _devices(), _samples(), []))
    assert len(run.markers) == 0
    assert tuple(run.markers.columns) == MARKER_COLUMNS
    with pytest.raises(AttributionError, match="the run has no markers"):  # readable, but nothing to attribute
        attribute(run.devices, run.samples, run.markers)


def test_samples_sorted_by_time(tmp_path: Path) -> None:
    run = read_run(write_run(tmp_path / "r", _devices(), list(reversed(_samples())), []))
    assert run.samples["ts_ns"].is_monotonic_increasing


def _out_of_range(table: str, column: str) -> list[float]:
    """Values just outside the column's bounds, and infinity for float columns."""
    lo, hi, _ = BOUNDS[table][column]
    values = [v for v in (lo - 1 if lo > -np.inf else None, hi + 1 if hi < np.inf else None) if v is not None]
    if column not in _INT_COLUMNS[table]:
        values = [lo - 0.5 if lo > -np.inf else -np.inf, np.inf]
    return [v for v in values if column not in _INT_COLUMNS[table] or -(2**63) <= v < 2**63]


_BOUNDED = [(t, c, v) for t in BOUNDS for c in BOUNDS[t] for v in _out_of_range(t, c)]


@pytest.mark.parametrize(("table", "column", "value"), _BOUNDED)
def test_every_column_out_of_range_is_named(tmp_path: Path, table: str, column: str, value: float) -> None:
    """Every bounded column of every table, just outside its range or infinite: file, column, row and fix."""
    run = write_run(tmp_path / "run", _devices(), _samples(links=True, errors=True), _markers(), _collectives())
    path = run / f"{table}.parquet"
    frame = pd.read_parquet(path)
    frame[column] = frame[column].astype(np.int64 if isinstance(value, int) else np.float64)
    frame.loc[1, column] = value
    frame.to_parquet(path, index=False)
    with pytest.raises(RunDirError) as err:
        read_run(run)
    message = str(err.value)
    assert message.startswith(f"{path}: column {column} must be ") and "row 1 has" in message and "Fix" in message


def test_a_gpu_listed_twice_in_devices_is_refused(tmp_path: Path) -> None:
    devices = _devices()
    run = write_run(tmp_path / "run", [*devices, devices[1]], _samples(), _markers())
    with pytest.raises(RunDirError, match=r"devices\.parquet: node=n1 gpu=1 is listed in rows 1, 2 .*remove the dup"):
        read_run(run)


def test_ratios_a_rounding_error_above_one_are_kept(tmp_path: Path) -> None:
    samples = _samples()
    samples[0].busy_ratio = 1.0000000000000002  # a time-weighted average of ones
    run = read_run(write_run(tmp_path / "run", _devices(), samples, _markers()))
    assert run.samples["busy_ratio"].max() == 1.0000000000000002


def test_collective_columns_are_the_records_fields() -> None:
    assert tuple(f.name for f in pb.CollectiveRecord.DESCRIPTOR.fields) == COLLECTIVE_COLUMNS


def test_collectives_round_trip_sorted_by_begin(tmp_path: Path) -> None:
    run = read_run(write_run(tmp_path / "run", _devices(), _samples(), _markers(), _collectives()))
    assert tuple(run.collectives.columns) == COLLECTIVE_COLUMNS
    assert run.collectives["seq"].tolist() == [40, 41]
    assert run.collectives["placed"].tolist() == [False, True]
    assert run.collectives["bytes"].tolist() == [2**40 + 1] * 2
    assert int(run.collectives["end_ns"].iloc[1]) == T0 + 8
    # As CSV, with the flag spelled as text and 0/1.
    csv = run.collectives.astype({"placed": object})
    csv["placed"] = ["False", "1"]
    csv.to_csv(run.path / "collectives.csv", index=False)
    (run.path / "collectives.parquet").unlink()
    again = read_run(run.path)
    pd.testing.assert_frame_equal(again.collectives, run.collectives)


def test_a_run_without_collectives_reads_as_an_empty_table(run_dir: Path) -> None:
    run = read_run(run_dir)
    assert tuple(run.collectives.columns) == COLLECTIVE_COLUMNS and run.collectives.empty
    assert run.collectives["begin_ns"].dtype == np.int64 and run.collectives["placed"].dtype == bool
    # A run written again without collectives does not keep an earlier run's table.
    write_run(run_dir, _devices(), _samples(), _markers(), _collectives())
    write_run(run_dir, _devices(), _samples(), _markers())
    assert not (run_dir / "collectives.parquet").exists()


def _refusal(tmp_path: Path, change: dict, csv: bool = False, table: str = "collectives") -> str:
    """The message read_run gives for a ``table`` (collectives, links, errors) whose row 1 has ``change``."""
    run = write_run(tmp_path / "run", _devices(), _samples(links=True, errors=True), _markers(), _collectives())
    frame = pd.read_parquet(run / f"{table}.parquet").astype(object)
    for column, value in change.items():
        frame.loc[1, column] = value
    if csv:
        (run / f"{table}.parquet").unlink()
        frame.to_csv(run / f"{table}.csv", index=False)
    else:
        frame.to_parquet(run / f"{table}.parquet", index=False)
    with pytest.raises(RunDirError) as err:
        read_run(run)
    return str(err.value)


@pytest.mark.hazard(item=1, input="collectives tables with a row that ends before it begins, a placed flag that is "
                    "neither true nor false, bytes beyond 64 bits, a text rank, a missing column",
                    promise="the run is refused with the file, the column or row and the fix; a run without the "
                    "table reads as an empty one")
def test_bad_collective_rows_are_refused_naming_the_fix(tmp_path: Path, hazard: HazardOutcome) -> None:
    messages = {
        "backwards": _refusal(tmp_path / "a", {"begin_ns": T0 + 9}),
        "placed": _refusal(tmp_path / "b", {"placed": "maybe"}, csv=True),
        "bytes": _refusal(tmp_path / "c", {"bytes": str(2**64 - 1)}, csv=True),
        "rank": _refusal(tmp_path / "d", {"rank": "zero"}, csv=True),
    }
    assert "collectives.parquet: row 1 ends before it begins" in messages["backwards"]
    assert "end_ns must be at or after its begin_ns" in messages["backwards"]
    assert "collectives.csv: column placed must be true or false (or 1/0); row 1 has 'maybe'" in messages["placed"]
    assert "column bytes must hold whole numbers" in messages["bytes"] and "row 1" in messages["bytes"]
    assert "column rank has non-numeric value 'zero' (row 1)" in messages["rank"]
    run = write_run(tmp_path / "e", _devices(), _samples(), _markers(), _collectives())
    pd.read_parquet(run / "collectives.parquet").drop(columns=["seq"]).to_parquet(run / "collectives.parquet")
    with pytest.raises(RunDirError, match=r"collectives\.parquet: missing column\(s\) seq; the collectives table "
                       "must have exactly the columns"):
        read_run(run)
    with pytest.raises(RunDirError, match=r"collectives \(argument\): row 0 ends before it begins"):
        write_run(tmp_path / "f", _devices(), _samples(), _markers(),
                  [{**_collectives()[0], "end_ns": T0}])
    hazard.outcome = (f"{len(messages) + 2} bad collectives tables refused, each naming the file or argument, the "
                      "row or column and the fix; a run without the table read as 0 collectives")


def test_per_link_counters_round_trip_in_the_links_table(tmp_path: Path) -> None:
    run = read_run(write_run(tmp_path / "run", _devices(), _samples(links=True), _markers()))
    assert tuple(run.links.columns) == LINK_COLUMNS
    assert len(run.links) == 3 * 2 * 2  # ticks x GPUs x links
    last = run.links[run.links["ts_ns"] == T0 + 20_000_001]
    assert last[["gpu", "link", "tx_bytes", "rx_bytes"]].values.tolist() == [[1, 0, 2e6, 1e6], [1, 1, 4e6, 2e6]]
    assert run.links["ts_ns"].dtype == np.int64
    # The samples table keeps its columns: the per-link tuple is not one of them.
    assert tuple(run.samples.columns) == SAMPLE_COLUMNS
    again = read_run(write_run(tmp_path / "copy", run.devices, run.samples, run.markers, links=run.links))
    pd.testing.assert_frame_equal(again.links, run.links)


def test_a_run_without_links_reads_as_none(run_dir: Path) -> None:
    run = read_run(run_dir)
    assert run.links.empty and tuple(run.links.columns) == LINK_COLUMNS
    assert not (run_dir / "links.parquet").exists()


@pytest.mark.hazard(item=2, input="links tables with a row that belongs to no sample, a link listed twice in one "
                    "sample, a link index beyond 63, a text link index",
                    promise="the run is refused with the file, the row or column and the fix; a run without the "
                    "table reads as an empty one")
def test_bad_link_rows_are_refused_naming_the_fix(tmp_path: Path, hazard: HazardOutcome) -> None:
    messages = {
        "orphan": _refusal(tmp_path / "a", {"ts_ns": T0 + 3}, table="links"),
        "twice": _refusal(tmp_path / "b", {"link": 0}, table="links"),
        "index": _refusal(tmp_path / "c", {"link": 64}, table="links"),
        "text": _refusal(tmp_path / "d", {"link": "one"}, csv=True, table="links"),
    }
    assert f"links.parquet: row 1 (ts_ns={T0 + 3}, node=n1, gpu=0) belongs to no sample" in messages["orphan"]
    assert "re-export the links table together with the samples table" in messages["orphan"]
    assert "repeats link 0 of the sample" in messages["twice"] and "remove the duplicate rows" in messages["twice"]
    assert "column link must be a link index from 0 to 63" in messages["index"]
    assert "column link has non-numeric value 'one' (row 1)" in messages["text"]
    assert read_run(write_run(tmp_path / "e", _devices(), _samples(), _markers())).links.empty
    hazard.outcome = (f"{len(messages)} bad links tables refused, each naming the file, the row or column and the "
                      "fix; a run without the table read as 0 link rows")


def test_health_counters_round_trip_in_the_errors_table(tmp_path: Path) -> None:
    run = read_run(write_run(tmp_path / "run", _devices(), _samples(errors=True), _markers()))
    assert tuple(run.errors.columns) == ERROR_COLUMNS
    assert len(run.errors) == 3 * 2 * 2  # ticks x GPUs x counters
    last = run.errors[run.errors["ts_ns"] == T0 + 20_000_001]
    assert last[["kind", "window", "detail", "value", "chip_wide"]].values.tolist() == [
        ["ecc_corrected", "volatile", "umc", 2.0, False], ["bad_pages", "", "", 2.0, True]]
    assert run.errors["chip_wide"].dtype == bool and tuple(run.samples.columns) == SAMPLE_COLUMNS
    again = read_run(write_run(tmp_path / "copy", run.devices, run.samples, run.markers, errors=run.errors))
    pd.testing.assert_frame_equal(again.errors, run.errors)
    assert read_run(write_run(tmp_path / "none", _devices(), _samples(), _markers())).errors.empty


@pytest.mark.hazard(item=17, input="errors tables with an unknown kind, a row that belongs to no sample, a counter "
                    "listed twice in one sample, a negative count, a chip_wide flag that is neither true nor false",
                    promise="the run is refused with the file, the row or column and the fix")
def test_bad_error_rows_are_refused_naming_the_fix(tmp_path: Path, hazard: HazardOutcome) -> None:
    messages = {
        "kind": _refusal(tmp_path / "a", {"kind": "ecc_maybe"}, table="errors"),
        "orphan": _refusal(tmp_path / "b", {"ts_ns": T0 + 3}, table="errors"),
        "twice": _refusal(tmp_path / "c", {"kind": "ecc_corrected", "window": "volatile", "detail": "umc"},
                          table="errors"),
        "negative": _refusal(tmp_path / "d", {"value": -1.0}, table="errors"),
        "flag": _refusal(tmp_path / "e", {"chip_wide": "perhaps"}, csv=True, table="errors"),
    }
    assert "errors.parquet: row 1 has unknown kind 'ecc_maybe'; use one of xid, ecc_corrected" in messages["kind"]
    assert f"errors.parquet: row 1 (ts_ns={T0 + 3}, node=n1, gpu=0) belongs to no sample" in messages["orphan"]
    assert "repeats counter kind=ecc_corrected window='volatile' detail='umc'" in messages["twice"]
    assert "column value must be a finite amount, not negative" in messages["negative"]
    assert "column chip_wide must be true or false (or 1/0); row 1 has 'perhaps'" in messages["flag"]
    hazard.outcome = f"{len(messages)} bad errors tables refused, each naming the file, the row or column and the fix"


def test_a_run_recorded_before_partitions_and_health_reads(tmp_path: Path) -> None:
    """Device and sample columns added later read as "not read" in an older run's files."""
    run = write_run(tmp_path / "run", _devices(), _samples(), _markers())
    devices = pd.read_parquet(run / "devices.parquet")
    devices.drop(columns=["pci_bus_id", "partition", "memory_partition", "chip_uuid", "compute_share"]).to_parquet(
        run / "devices.parquet", index=False)
    pd.read_parquet(run / "samples.parquet").drop(columns=["mem_temp_c", "vr_temp_c"]).to_parquet(
        run / "samples.parquet", index=False)
    old = read_run(run)
    assert old.devices["compute_share"].tolist() == [1.0, 1.0] and old.devices["partition"].tolist() == ["", ""]
    assert old.samples["mem_temp_c"].isna().all() and tuple(old.samples.columns) == SAMPLE_COLUMNS
