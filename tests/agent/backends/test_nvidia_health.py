"""Health and error counters of the nvidia backend (``Sample.errors``) against the autospecced pynvml.

The fake answers from ``tests/fixtures/nvml/h100_sxm_2gpu_health.json``: ECC totals, remapped rows,
PCIe replays and NVLink error counters of the 2x H100 SXM5 node of the load fixture, in the shapes
pynvml returns them. Both GPUs are whole chips, so no counter is chip-wide (the MIG tests are in
test_nvidia_mig.py).
"""
from __future__ import annotations

import ctypes
import logging
from typing import Any

import pynvml
import pytest

from agent.backends.nvidia import HEALTH_INTERVAL_NS, NvidiaBackend
from chopper.schema import ERROR_KINDS, ErrorCount, Sample
from tests.support.hazards import HazardOutcome
from tests.support.nvml_fake import FakeNode, backend_for, load_fixture

NOT_SUPPORTED = "NVML_ERROR_NOT_SUPPORTED"
LINK_ERROR_FIELDS = (pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
                     pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
                     pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
                     pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL)


@pytest.fixture
def node() -> FakeNode:
    """A fresh fake NVML of the 2x H100 node with its health answers, for a test to edit."""
    return FakeNode(load_fixture())


def opened(node: FakeNode) -> NvidiaBackend:
    backend = backend_for(node)
    backend.open()
    return backend


def readings(backend: NvidiaBackend, node: FakeNode, count: int) -> list[list[Sample]]:
    """``count`` health readings, one interval apart (the load fixture's tick 0 answers)."""
    t0 = node.at(0)
    return [backend.sample(t0 + k * HEALTH_INTERVAL_NS) for k in range(count)]


def by_key(sample: Sample) -> dict[tuple[str, str, str], float]:
    counters = {(e.kind, e.window, e.detail): e.value for e in sample.errors}
    assert len(counters) == len(sample.errors), "a counter listed twice"
    return counters


def test_first_reading_has_every_counter_as_nvml_reports_it(node: FakeNode) -> None:
    gpu0, gpu1 = opened(node).sample(node.at(0))

    assert all(e.kind in ERROR_KINDS and not e.chip_wide for s in (gpu0, gpu1) for e in s.errors)
    expected = [("ecc_corrected", "volatile", "total", 2.0), ("ecc_corrected", "aggregate", "total", 37.0),
                ("ecc_uncorrected", "volatile", "total", 0.0), ("ecc_uncorrected", "aggregate", "total", 1.0),
                # Hopper remaps rows; page retirement answers NOT_SUPPORTED and is left out, not 0.
                ("remapped_rows", "", "correctable", 2.0), ("remapped_rows", "", "uncorrectable", 1.0),
                ("remap_pending", "", "", 0.0), ("remap_failed", "", "", 0.0), ("pcie_replay", "", "", 14.0),
                ("link_crc", "", "flit", 1.0), ("link_crc", "", "data", 0.0), ("link_replay", "", "", 9.0),
                ("link_recovery", "", "", 1.0)]
    assert gpu1.errors == tuple(ErrorCount(*e) for e in expected)
    assert by_key(gpu0)[("link_replay", "", "")] == 3.0
    assert ("retired_pages", "", "single_bit") not in by_key(gpu0)


def test_counters_appear_at_most_once_per_second_on_that_tick_only(node: FakeNode) -> None:
    backend = opened(node)
    t0 = node.at(0)
    ticks = [t0 + k * 200_000_000 for k in range(6)] + [t0 + HEALTH_INTERVAL_NS + 999_999_999]  # a 5 Hz sampler
    with_errors = [t for t in ticks if all(s.errors for s in backend.sample(t))]

    assert with_errors == [t0, t0 + HEALTH_INTERVAL_NS]  # 1.0 s after the first; not 1.999 s after that
    assert node.nv.nvmlDeviceGetRemappedRows.call_count == 2 * 2  # two readings x two GPUs
    assert node.nv.nvmlDeviceGetPcieReplayCounter.call_count == 4


def test_a_tick_between_readings_carries_no_errors(node: FakeNode) -> None:
    backend = opened(node)
    backend.sample(node.at(0))
    assert [s.errors for s in backend.sample(node.at(1))] == [(), ()]  # 200 ms later


def test_a_wall_clock_stepped_back_reads_again_at_once(node: FakeNode) -> None:
    backend = opened(node)
    t0 = node.at(0)
    backend.sample(t0)
    assert all(s.errors for s in backend.sample(t0 - 3600 * 10**9))


def test_xid_events_are_counted_per_code_since_open(node: FakeNode) -> None:
    backend = opened(node)
    for code in (79, 13, 79):
        node.xid(1, code)
    t0 = node.at(0)
    first = backend.sample(t0)
    node.xid(1, 79)
    node.xid(1, 48)
    between = backend.sample(t0 + 500_000_000)  # events wait in the set until the next reading
    later = backend.sample(t0 + HEALTH_INTERVAL_NS)

    xids = [{d: v for (k, _, d), v in by_key(s).items() if k == "xid"} for s in (*first, *later)]
    assert xids == [{}, {"13": 1.0, "79": 2.0}, {}, {"13": 1.0, "48": 1.0, "79": 3.0}]
    assert [s.errors for s in between] == [(), ()]
    assert node.pending_events[1] == []
    # Every wait had a 0 ms timeout (the fake asserts it): one per reading and GPU, plus one per event.
    assert node.nv.nvmlEventSetWait_v2.call_count == 2 * 2 + 5


def test_event_sets_register_xid_critical_errors_and_are_freed(node: FakeNode) -> None:
    backend = opened(node)
    assert node.nv.nvmlDeviceRegisterEvents.call_count == 2
    for call in node.nv.nvmlDeviceRegisterEvents.call_args_list:
        assert call.args[1] == pynvml.nvmlEventTypeXidCriticalError
    backend.close()
    assert node.nv.nvmlEventSetFree.call_count == 2


def test_a_gpu_without_event_support_reads_no_xids(node: FakeNode, caplog: pytest.LogCaptureFixture) -> None:
    node.health["devices"][0]["xid_events"] = NOT_SUPPORTED
    with caplog.at_level(logging.WARNING, logger="agent.backends.nvidia"):
        backend = opened(node)
    node.xid(1, 31)
    gpu0, gpu1 = backend.sample(node.at(0))

    said = [r.getMessage() for r in caplog.records if "event=xid_unavailable" in r.getMessage()]
    assert len(said) == 1 and "gpu=0" in said[0] and "Not Supported" in said[0], said
    assert not any(e.kind == "xid" for e in gpu0.errors)
    assert ("ecc_corrected", "aggregate", "total") in by_key(gpu0)  # the other counters still come
    assert by_key(gpu1)[("xid", "", "31")] == 1.0
    node.nv.nvmlEventSetFree.assert_called_once()  # the set that could not be registered


def test_not_supported_queries_are_not_asked_again(node: FakeNode, caplog: pytest.LogCaptureFixture) -> None:
    node.health["devices"][1]["pcie_replay_counter"] = NOT_SUPPORTED
    backend = opened(node)
    with caplog.at_level(logging.INFO, logger="agent.backends.nvidia"):
        got = readings(backend, node, 3)

    # Retired pages (2 causes) and their pending status answer NOT_SUPPORTED on H100: asked once per GPU.
    assert node.nv.nvmlDeviceGetRetiredPages.call_count == 2 * 2
    assert node.nv.nvmlDeviceGetRetiredPagesPendingStatus.call_count == 2
    assert node.nv.nvmlDeviceGetPcieReplayCounter.call_count == 3 + 1  # GPU 0 each reading, GPU 1 once
    assert node.nv.nvmlDeviceGetRemappedRows.call_count == 3 * 2
    assert all(("pcie_replay", "", "") not in by_key(samples[1]) for samples in got)
    said = [r.getMessage() for r in caplog.records if "event=health_unsupported" in r.getMessage()]
    assert len(said) == 2 * 3 + 1, said  # each query said once: 3 retirement queries x 2 GPUs, GPU 1's replays


def test_a_not_supported_nvlink_error_field_is_left_out_and_not_asked_again(node: FakeNode) -> None:
    fields = node.health["devices"][0]["fields"]
    fields["NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"]["nvmlReturn"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = opened(node)
    first, second = readings(backend, node, 2)

    for samples in (first, second):
        assert ("link_recovery", "", "") not in by_key(samples[0])
        assert by_key(samples[0])[("link_replay", "", "")] == 3.0
        assert by_key(samples[1])[("link_recovery", "", "")] == 1.0
    gpu0_calls = [c.args[1] for c in node.nv.nvmlDeviceGetFieldValues.call_args_list if c.args[0] == ("handle", 0)]
    asked = [[fid for fid, _ in ids if fid in LINK_ERROR_FIELDS] for ids in gpu0_calls[1:]]  # [0]: link count
    assert asked == [list(LINK_ERROR_FIELDS), list(LINK_ERROR_FIELDS[:3])]


def test_nvlink_errors_ride_in_the_one_batched_field_call_of_a_health_tick(node: FakeNode) -> None:
    backend = opened(node)
    node.nv.nvmlDeviceGetFieldValues.reset_mock()
    backend.sample(node.at(0))  # a health tick
    backend.sample(node.at(1))  # 200 ms later: none

    calls = node.nv.nvmlDeviceGetFieldValues.call_args_list
    assert len(calls) == 2 * 2  # one per GPU and tick, health or not
    for call, health in zip(calls, (True, True, False, False), strict=True):
        errors = [(fid, scope) for fid, scope in call.args[1] if fid in LINK_ERROR_FIELDS]
        assert errors == ([(fid, 0) for fid in LINK_ERROR_FIELDS] if health else [])
    node.nv.nvmlDeviceGetNvLinkErrorCounter.assert_not_called()


def test_a_gpu_without_nvlink_reports_no_link_errors(node: FakeNode) -> None:
    for dev in node.fx["devices"]:
        dev["nvlink_link_count"] = 0  # a PCIe card
    samples = opened(node).sample(node.at(0))
    assert all(not e.kind.startswith("link_") for s in samples for e in s.errors)
    assert all(("pcie_replay", "", "") in by_key(s) for s in samples)


def test_ecc_is_left_out_while_ecc_mode_is_disabled(node: FakeNode) -> None:
    node.health["devices"][0]["ecc_mode"] = [pynvml.NVML_FEATURE_DISABLED, pynvml.NVML_FEATURE_ENABLED]
    gpu0, gpu1 = opened(node).sample(node.at(0))
    assert not any(e.kind.startswith("ecc_") for e in gpu0.errors)  # pending enable counts for nothing yet
    assert ("ecc_corrected", "volatile", "total") in by_key(gpu1)
    assert all(c.args[0] == ("handle", 1) for c in node.nv.nvmlDeviceGetTotalEccErrors.call_args_list)


def test_a_gpu_before_ampere_reports_retired_pages_not_rows(node: FakeNode) -> None:
    dev = node.health["devices"][0]
    dev["retired_pages"] = {  # nvmlDeviceGetRetiredPages answers the retired pages' addresses
        "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS": [0x1A2B000, 0x3C4D000, 0x5E6F000],
        "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR": [0x7A8B000]}
    dev["retired_pages_pending"] = pynvml.NVML_FEATURE_ENABLED
    dev["remapped_rows"] = NOT_SUPPORTED  # as a V100 answers
    backend = opened(node)
    first, second = readings(backend, node, 2)

    got = by_key(first[0])
    assert (got[("retired_pages", "", "single_bit")], got[("retired_pages", "", "double_bit")]) == (3.0, 1.0)
    assert got[("retirement_pending", "", "")] == 1.0
    assert not any(k in ("remapped_rows", "remap_pending", "remap_failed") for k, _, _ in got)
    assert by_key(second[0]) == got
    assert [c.args[0] for c in node.nv.nvmlDeviceGetRemappedRows.call_args_list].count(("handle", 0)) == 1


def test_counters_grow_between_readings(node: FakeNode) -> None:
    backend = opened(node)
    t0 = node.at(0)
    first = by_key(backend.sample(t0)[0])
    totals = node.health["devices"][0]["total_ecc_errors"]["NVML_MEMORY_ERROR_TYPE_CORRECTED"]
    totals["NVML_VOLATILE_ECC"] += 5
    totals["NVML_AGGREGATE_ECC"] += 5
    node.health["devices"][0]["remapped_rows"] = [2, 0, 1, 0]  # a new correctable row, pending until reset
    second = by_key(backend.sample(t0 + HEALTH_INTERVAL_NS)[0])

    assert second[("ecc_corrected", "volatile", "total")] - first[("ecc_corrected", "volatile", "total")] == 5
    assert second[("ecc_corrected", "aggregate", "total")] == 17.0
    assert (second[("remapped_rows", "", "correctable")], second[("remap_pending", "", "")]) == (2.0, 1.0)


def _break_health_queries(node: FakeNode) -> dict[str, str]:
    """GPU 0's health queries answer NO_PERMISSION, GPU_IS_LOST, UNKNOWN or TIMEOUT; what each got."""
    broken = {"nvmlDeviceGetEccMode": "NVML_ERROR_NO_PERMISSION",
              "nvmlDeviceGetRemappedRows": "NVML_ERROR_GPU_IS_LOST",
              "nvmlDeviceGetPcieReplayCounter": "NVML_ERROR_UNKNOWN",
              "nvmlEventSetWait_v2": "NVML_ERROR_UNKNOWN"}
    for name, error in broken.items():
        answer = getattr(node.nv, name).side_effect

        def refuse(target: Any, *args: Any, answer: Any = answer, error: str = error) -> Any:
            # target: a GPU's handle, or the event set registered for it
            gpu = target[1] if isinstance(target, tuple) else node.event_sets[ctypes.addressof(target)]
            if gpu == 0:
                raise pynvml.NVMLError(getattr(pynvml, error))
            return answer(target, *args)

        getattr(node.nv, name).side_effect = refuse
    return {name.removeprefix("nvmlDeviceGet"): error.removeprefix("NVML_ERROR_") for name, error in broken.items()}


@pytest.mark.hazard(item=17, input="NVML health queries that answer NO_PERMISSION (ECC mode), GPU_IS_LOST (remapped "
                    "rows), UNKNOWN (PCIe replays, the XID event wait) on one GPU, NOT_SUPPORTED (page retirement) "
                    "on both",
                    promise="the sample is never failed; a refused counter is left out, never reported as 0, and "
                    "asked again next second, logged once; a NOT_SUPPORTED query is not asked again")
def test_refused_health_queries_never_fail_the_sample(node: FakeNode, hazard: HazardOutcome,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    backend = opened(node)
    node.xid(0, 94)
    broken = _break_health_queries(node)
    with caplog.at_level(logging.INFO, logger="agent.backends.nvidia"):
        got = readings(backend, node, 3)

    for samples in got:
        assert [s.power_w for s in samples] == [699.42, 612.88]  # the rest of the sample is whole
        assert sorted({k for k, _, _ in by_key(samples[0])}) == ["link_crc", "link_recovery", "link_replay"]
        assert len(samples[1].errors) == 13
    asked = node.nv.nvmlDeviceGetRemappedRows.call_count
    assert asked == node.nv.nvmlDeviceGetEccMode.call_count == 3 * 2
    failed = [r.getMessage() for r in caplog.records if "event=health_query_failed" in r.getMessage()]
    assert len(failed) == 3, failed  # ECC mode, rows, replays of GPU 0, each once over three readings
    assert node.pending_events[0], "the XID stays queued while the wait fails"
    hazard.outcome = (f"3 readings of 2 H100s, none failed, power intact; GPU 0's refused queries ({broken}) left "
                      f"out: {len(got[0][0].errors)} counters kept (its NVLink errors) against GPU 1's "
                      f"{len(got[0][1].errors)}; asked again each reading ({asked} remapped-row calls), "
                      f"{len(failed)} log lines; page retirement (NOT_SUPPORTED) asked "
                      f"{node.nv.nvmlDeviceGetRetiredPages.call_count} times in all")
