"""Health and error counters of the amd backend (``Sample.errors``) against the autospecced amdsmi.

The fake answers from ``tests/fixtures/amdsmi/mi300x_health.json``: two readings of an MI300X's
RAS ECC counts, PCIe replays and NAKs, XGMI error status and bad-page table, in the shapes
amdsmi 7 returns them. Two whole-chip MI300X GPUs, so every counter is per device (chip_wide False).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from agent.backends.amd import HEALTH_INTERVAL_NS, AmdBackend
from chopper.schema import ERROR_KINDS, ErrorCount, Sample
from tests.support.amdsmi_fake import FakeNode, backend_for, import_real_amdsmi, load
from tests.support.hazards import HazardOutcome

T0 = 1_735_689_600_000_000_000
TICK_NS = 100_000_000  # a 10 Hz sampler
# Enabled in the fixture and counted: MP0, MP1 and FUSE are enabled too, but amd-smi calls them uncountable.
BLOCKS = ["umc", "sdma", "gfx", "mmhub", "pcie_bif", "hdp", "xgmi_wafl", "mca", "vcn", "jpeg", "ih", "mpio"]
ECC = ("ecc_corrected", "ecc_uncorrected", "ecc_deferred")


@pytest.fixture(scope="module")
def real_amdsmi() -> ModuleType:
    return import_real_amdsmi()


@pytest.fixture
def node(real_amdsmi: ModuleType) -> FakeNode:
    return FakeNode(real_amdsmi, load("mi300x_under_load.json"))


@pytest.fixture
def backend(node: FakeNode) -> Iterator[AmdBackend]:
    with backend_for(node, opened=True) as b:
        yield b


def _by_key(sample: Sample) -> dict[tuple[str, str, str], float]:
    counters = {(e.kind, e.window, e.detail): e.value for e in sample.errors}
    assert len(counters) == len(sample.errors), "a counter listed twice"
    return counters


def test_first_reading_has_every_family_as_amd_documents_it(backend: AmdBackend, node: FakeNode,
                                                             real_amdsmi: ModuleType) -> None:
    samples = backend.sample(T0)

    for s in samples:
        assert all(e.kind in ERROR_KINDS and not e.chip_wide for e in s.errors)
    got = _by_key(samples[0])
    ecc = {(kind, detail) for kind, window, detail in got if kind in ECC and window == "volatile"}
    assert ecc == {(kind, d) for kind in ECC for d in [*BLOCKS, "total"]}
    assert got["ecc_corrected", "volatile", "umc"] == 12.0
    assert got["ecc_deferred", "volatile", "umc"] == 1.0
    assert got["ecc_corrected", "volatile", "xgmi_wafl"] == 1.0
    assert got["ecc_corrected", "volatile", "total"] == 13.0
    assert got["ecc_uncorrected", "volatile", "total"] == 0.0
    assert (got["pcie_replay", "", ""], got["pcie_nak_sent", "", ""], got["pcie_nak_received", "", ""]) == (3, 1, 0)
    assert got["xgmi_error", "", ""] == 0.0
    assert {k[2]: v for k, v in got.items() if k[0] == "bad_pages"} == {"retired": 2, "pending": 0, "unreservable": 0}
    assert len(got) == 13 * 3 + 3 + 1 + 3
    # The vendor enum, not a name, goes to amdsmi; the disabled and uncountable blocks are not asked.
    asked = {c.args[1] for c in node.smi.amdsmi_get_gpu_ecc_count.call_args_list}
    assert asked == {real_amdsmi.AmdSmiGpuBlock[b.upper()] for b in BLOCKS}


def test_health_is_read_at_most_once_per_second_and_only_on_that_tick(backend: AmdBackend, node: FakeNode) -> None:
    ticks = [backend.sample(T0 + k * TICK_NS) for k in range(25)]  # 2.4 s at 10 Hz

    read = [k for k, samples in enumerate(ticks) if samples[0].errors]
    assert read == [0, 10, 20]
    assert all(bool(s.errors) == (k in read) for k, samples in enumerate(ticks) for s in samples)
    assert HEALTH_INTERVAL_NS == 10 * TICK_NS
    assert node.smi.amdsmi_get_pcie_info.call_count == 3 * 2  # per reading, per GPU
    # The RAS block list is fixed when the driver loads: read once per GPU, not per reading.
    assert node.smi.amdsmi_get_gpu_ras_block_features_enabled.call_count == 2


def test_counters_move_between_readings(backend: AmdBackend, node: FakeNode) -> None:
    first = _by_key(backend.sample(T0)[0])
    node.tick = 1
    assert backend.sample(T0 + TICK_NS)[0].errors == ()
    second = _by_key(backend.sample(T0 + HEALTH_INTERVAL_NS)[0])

    moved = {k: second[k] - first[k] for k in first if second[k] != first[k]}
    assert moved == {
        ("ecc_corrected", "volatile", "umc"): 3, ("ecc_corrected", "volatile", "gfx"): 2,
        ("ecc_corrected", "volatile", "total"): 5, ("pcie_replay", "", ""): 2, ("pcie_nak_received", "", ""): 1,
        ("xgmi_error", "", ""): 1, ("bad_pages", "", "pending"): 1,
    }


def test_a_clock_stepped_back_reads_again(backend: AmdBackend) -> None:
    assert backend.sample(T0)[0].errors
    assert not backend.sample(T0 + TICK_NS)[0].errors
    assert backend.sample(T0 - 5 * HEALTH_INTERVAL_NS)[0].errors  # NTP stepped CLOCK_REALTIME back


def test_reopen_reads_health_on_its_first_tick(backend: AmdBackend) -> None:
    assert backend.sample(T0)[0].errors
    backend.open()
    assert backend.sample(T0 + TICK_NS)[0].errors


def test_an_unsupported_query_is_not_asked_again(backend: AmdBackend, node: FakeNode,
                                                 real_amdsmi: ModuleType) -> None:
    unsupported = real_amdsmi.amdsmi_wrapper.AMDSMI_STATUS_NOT_SUPPORTED
    node.fail("amdsmi_get_pcie_info", unsupported)
    node.fail("amdsmi_gpu_xgmi_error_status", unsupported)  # a GPU outside an XGMI hive
    ecc = node.smi.amdsmi_get_gpu_ecc_count.side_effect
    node.smi.amdsmi_get_gpu_ecc_count.side_effect = \
        lambda h, block: (_ for _ in ()).throw(node.error(unsupported)) if block.name == "MPIO" else ecc(h, block)

    readings = [_by_key(backend.sample(T0 + k * HEALTH_INTERVAL_NS)[0]) for k in range(3)]

    for got in readings:
        assert not {k for k in got if k[0].startswith(("pcie", "xgmi")) or k[2] == "mpio"}
        assert got["ecc_corrected", "volatile", "umc"] == 12.0 and ("bad_pages", "", "retired") in got
    assert node.smi.amdsmi_get_pcie_info.call_count == 2  # once per GPU, then never again
    assert node.smi.amdsmi_gpu_xgmi_error_status.call_count == 2
    mpio = [c for c in node.smi.amdsmi_get_gpu_ecc_count.call_args_list if c.args[1].name == "MPIO"]
    assert len(mpio) == 2
    # Per GPU: all 12 blocks in the first reading, the 11 others in the next two.
    assert node.smi.amdsmi_get_gpu_ecc_count.call_count == 2 * (len(BLOCKS) + 2 * (len(BLOCKS) - 1))


def test_a_gpu_without_ras_reports_what_else_it_has(backend: AmdBackend, node: FakeNode,
                                                    real_amdsmi: ModuleType) -> None:
    unsupported = real_amdsmi.amdsmi_wrapper.AMDSMI_STATUS_NOT_SUPPORTED
    for query in ("amdsmi_get_gpu_ras_block_features_enabled", "amdsmi_get_gpu_total_ecc_count",
                  "amdsmi_get_gpu_bad_page_info"):
        node.fail(query, unsupported)

    for k in range(2):
        got = _by_key(backend.sample(T0 + k * HEALTH_INTERVAL_NS)[0])
        assert sorted(got) == [("pcie_nak_received", "", ""), ("pcie_nak_sent", "", ""), ("pcie_replay", "", ""),
                               ("xgmi_error", "", "")]
    node.smi.amdsmi_get_gpu_ecc_count.assert_not_called()
    assert node.smi.amdsmi_get_gpu_ras_block_features_enabled.call_count == 2


def _health_answers(node: FakeNode, real: ModuleType) -> dict[str, Any]:
    """Each health query answering in its own broken way; returns what each was made to do."""
    status = real.amdsmi_wrapper
    node.fail("amdsmi_get_gpu_ras_block_features_enabled", status.AMDSMI_STATUS_NO_PERM)
    node.fail("amdsmi_get_gpu_total_ecc_count", status.AMDSMI_STATUS_BUSY)  # a "device lost" code elsewhere
    node.smi.amdsmi_get_pcie_info.return_value = {"pcie_metric": {
        "pcie_replay_count": "N/A", "pcie_nak_sent_count": 0xFFFFFFFFFFFFFFFF, "pcie_nak_received_count": -4}}
    node.smi.amdsmi_get_pcie_info.side_effect = None
    node.smi.amdsmi_gpu_xgmi_error_status.side_effect = lambda h: 7  # no AmdSmiXgmiStatus value
    node.smi.amdsmi_get_gpu_bad_page_info.side_effect = lambda h: [
        {"value": 0, "page_address": 1, "page_size": 4096, "status": 9}, "not a record",
        {"value": 2, "page_address": 3, "page_size": 4096, "status": 1}]
    return {"ras blocks": "NO_PERM", "ecc total": "BUSY", "pcie": "N/A, all-ones, negative",
            "xgmi": "status 7", "bad pages": "status 9, a string, one PENDING record"}


@pytest.mark.hazard(item=17, input="amdsmi health queries that refuse (NO_PERM, BUSY) or answer N/A, all-ones, "
                    "negative counts, an XGMI status of 7, bad-page records of an unknown status or not records",
                    promise="the sample is never failed; a bad counter is left out, never reported as 0; the "
                    "refused queries are asked again next second, logged once each")
def test_broken_health_answers_never_fail_the_sample(backend: AmdBackend, node: FakeNode, real_amdsmi: ModuleType,
                                                     hazard: HazardOutcome, caplog: pytest.LogCaptureFixture) -> None:
    broken = _health_answers(node, real_amdsmi)
    caplog.set_level(logging.INFO, logger="agent.backends.amd")

    readings = [backend.sample(T0 + k * HEALTH_INTERVAL_NS) for k in range(3)]

    for samples in readings:
        assert [s.power_w for s in samples] == [742.0, 742.0]  # the rest of the sample is whole
        assert samples[0].errors == (ErrorCount("bad_pages", "", "retired", 0.0),
                                     ErrorCount("bad_pages", "", "pending", 1.0),
                                     ErrorCount("bad_pages", "", "unreservable", 0.0))
    asked = node.smi.amdsmi_get_gpu_ras_block_features_enabled.call_count
    assert asked == node.smi.amdsmi_get_gpu_total_ecc_count.call_count == 3 * 2
    lines = [r.getMessage() for r in caplog.records if "health_query_failed" in r.getMessage()]
    assert len(lines) == 2 * 2  # two refused queries on two GPUs, each logged once over three readings
    hazard.outcome = (f"3 readings of 2 GPUs, none failed, power intact; broken answers ({broken}) left out: "
                      f"{len(readings[0][0].errors)} counters kept (the bad-page table: 0 retired, 1 pending); "
                      f"refused queries asked again each reading ({asked} calls), {len(lines)} log lines")
