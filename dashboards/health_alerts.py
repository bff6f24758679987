"""GPU health alerts: XIDs, ECC, memory repair, PCIe, NVLink and XGMI errors, bad pages, health status.

They read the agent's health series (docs/HEALTH.md) as the vendor libraries count them; every
window is PromQL's (``increase``, ``rate``, ``delta``), so a rule's window is a parameter, not the
agent's. Severity follows the agent's health status (``agent/health.py``): critical where NVIDIA's
XID catalog resolves the error with a GPU reset, a node reboot or a support case (uncorrected ECC,
a failed row remap, the critical XIDs), warning for errors the hardware corrected or retried.

A GPU is ``(node, gpu)``; ``max by`` over the splits a device reports twice (an ECC count in the
volatile and the aggregate window, per RAS block and as the device ``total``) counts each error
once. XID series appear at a code's first event (the agent counts from 0 when its backend
opens), so an XID rule also fires for a code whose series is new within the window: ``increase``
needs two samples and would miss the first event of each code.
"""
from __future__ import annotations

from agent.health import APPLICATION_XIDS, CRITICAL_XIDS
from dashboards.model import Alert
from dashboards.names import C
from dashboards.params import RuleParams

GPU = "{{ $labels.gpu }} on {{ $labels.node }}"


def _codes(codes: frozenset[str]) -> str:
    return "|".join(sorted(codes, key=int))


def _xid_rise(selector: str, window: str) -> str:
    """XIDs of ``selector`` that rose within ``window``, by GPU and code: new events, or a new code."""
    x = f"{C.gpu_xid_errors_total}{{{selector}}}"
    return (f"sum by (node, gpu, xid) (increase({x}[{window}])) > 0\n"
            f"or sum by (node, gpu, xid) ({x} unless {x} offset {window})")


def _xid(p: RuleParams) -> list[Alert]:
    critical = _xid_rise(f'xid=~"{_codes(CRITICAL_XIDS)}"', p.health_window)
    other = _xid_rise(f'xid!~"{_codes(CRITICAL_XIDS | APPLICATION_XIDS)}"', p.health_window)
    return [
        Alert(
            "ChopperGPUXidCritical", critical, "0s", "critical",
            f"GPU {GPU} raised XID {{{{ $labels.xid }}}}",
            f"GPU {GPU} raised XID {{{{ $labels.xid }}}} {{{{ $value }}}} times in the last {p.health_window}: "
            "an XID that NVIDIA resolves with a GPU reset, a node reboot or a support case.",
            "1. Look the code up in NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors) and read the "
            "driver's message in the node's kernel log (dmesg | grep -i xid): 48/94/95 ECC, 61/62 "
            "microcontroller halt, 64 row remap failure, 74 NVLink, 79 fallen off the bus, 119/120 GSP, 140 "
            "unrecovered ECC. 2. Drain the node (cordon / scontrol update state=drain) so no new job lands on "
            "the GPU. 3. Jobs on it will fail or hang: restart them elsewhere from their last checkpoint. "
            "4. Reset the GPU (nvidia-smi -r) or reboot; if the code returns, open a support case with an "
            "nvidia-bug-report.",
            ("health_window",),
            f"Critical XIDs: {', '.join(sorted(CRITICAL_XIDS, key=int))} (`agent.health.CRITICAL_XIDS`).",
        ),
        Alert(
            "ChopperGPUXidError", other, "0s", "warning",
            f"GPU {GPU} raised XID {{{{ $labels.xid }}}}",
            f"GPU {GPU} raised XID {{{{ $labels.xid }}}} {{{{ $value }}}} times in the last {p.health_window}.",
            "1. Look the code up in NVIDIA's XID catalog and read the kernel log (dmesg | grep -i xid) on the "
            "node. 2. If the job on the GPU slowed or failed at the same time (Job dashboard), treat the GPU as "
            "suspect: a code that repeats across jobs is the GPU's, one that follows a job is the job's. "
            "3. Drain the node if it repeats.",
            ("health_window",),
            f"Every XID but the critical ones and the application's own ({', '.join(sorted(APPLICATION_XIDS, key=int))}"
            ": an exception, a page fault, a stopped or preempted application), which are counted but page "
            "no one. `xid=\"other\"` holds codes beyond the agent's 32 per GPU.",
        ),
    ]


def _ecc(p: RuleParams) -> list[Alert]:
    ecc = C.gpu_ecc_errors_total
    return [
        Alert(
            "ChopperGPUEccUncorrected",
            f'max by (node, gpu) (increase({ecc}{{severity="uncorrected"}}[{p.health_window}])) > 0',
            "0s", "critical",
            f"GPU {GPU} had an uncorrected ECC error",
            f"GPU {GPU} counted {{{{ $value }}}} uncorrected ECC errors in the last {p.health_window}: data in "
            "its memory or caches was lost.",
            "1. The job on the GPU may have computed on corrupt data or crashed: check it (Job dashboard, its "
            "logs) and restart it from a checkpoint taken before the error. 2. Check chopper_gpu_remapped_rows / "
            "chopper_gpu_bad_pages and chopper_gpu_memory_repair_state: a pending repair takes effect at the "
            "next GPU reset. 3. Drain the node, reset the GPU; if errors return or a remap failed, replace it.",
            ("health_window",),
        ),
        Alert(
            "ChopperGPUEccCorrectedRate",
            f'max by (node, gpu) (rate({ecc}{{severity="corrected"}}[{p.rate_window}])) > {p.ecc_corrected_per_s}',
            p.health_for, "warning",
            f"GPU {GPU} corrects ECC errors at a high rate",
            f"GPU {GPU} corrected {{{{ $value | humanize }}}} ECC errors per second over {p.rate_window} for "
            f"{p.health_for}.",
            "1. Corrected errors cost no data but a rising rate often precedes uncorrected ones and retired "
            "pages or remapped rows: watch the GPU dashboard's health row. 2. Compare with the node's other "
            "GPUs: one GPU is the GPU's memory, all of them the node (temperature, firmware). 3. Plan to drain "
            "and reset the GPU at the next job boundary.",
            ("rate_window", "ecc_corrected_per_s", "health_for"),
        ),
    ]


def _memory(p: RuleParams) -> list[Alert]:
    state = C.gpu_memory_repair_state
    return [
        Alert(
            "ChopperGPURowRemapFailed",
            f'max by (node, gpu) ({state}{{state="remap_failed"}}) == 1', "0s", "critical",
            f"GPU {GPU} failed to remap a memory row",
            f"GPU {GPU} could not remap a faulty HBM row: the faulty memory stays in use.",
            "1. Drain the node: the GPU will keep producing memory errors. 2. Restart its jobs elsewhere. "
            "3. NVIDIA treats a failed remap as a hardware fault: replace the GPU (open a support case with an "
            "nvidia-bug-report).",
            (),
        ),
        Alert(
            "ChopperGPUMemoryRepairPending",
            f'max by (node, gpu, state) ({state}{{state=~"remap_pending|retirement_pending"}}) == 1',
            "0s", "warning",
            f"GPU {GPU} has a memory repair pending ({{{{ $labels.state }}}})",
            f"GPU {GPU} has a memory repair waiting for the next GPU reset ({{{{ $labels.state }}}}): until then "
            "the faulty memory stays in use.",
            "1. Let the running job finish or checkpoint. 2. Drain the node and reset the GPU (nvidia-smi -r, "
            "or reboot) so the repair takes effect. 3. The state clears after the reset; a repair that keeps "
            "coming back is a GPU to replace.",
            (),
        ),
        Alert(
            "ChopperGPUBadPages",
            f"max by (node, gpu, status) (delta({C.gpu_bad_pages}[{p.health_window}])) > 0", "0s", "warning",
            f"GPU {GPU} added HBM pages to its bad-page table ({{{{ $labels.status }}}})",
            f"GPU {GPU} has {{{{ $value }}}} more {{{{ $labels.status }}}} bad pages than {p.health_window} ago.",
            "1. Check the GPU's ECC counters on the GPU dashboard: bad pages follow uncorrectable errors. "
            "2. pending pages are retired at the next reset: drain and reset the GPU at a job boundary. "
            "3. unreservable pages or a table near the driver's limit (amd-smi ras) mean the GPU should be "
            "replaced.",
            ("health_window",),
        ),
    ]


def _links(p: RuleParams) -> list[Alert]:
    w = p.rate_window
    return [
        Alert(
            "ChopperGPUPCIeReplays",
            f"max by (node, gpu) (rate({C.gpu_pcie_replays_total}[{w}])) > {p.pcie_replays_per_s}",
            p.health_for, "warning",
            f"GPU {GPU} replays PCIe packets",
            f"GPU {GPU} replayed {{{{ $value | humanize }}}} PCIe packets per second over {w} for {p.health_for}.",
            "1. Replays are retransmissions after link errors: the link works but slower, and host-device "
            "copies (data loading, checkpoints) slow down. 2. Check the link's negotiated width and speed "
            "(nvidia-smi -q -d PCIE / lspci -vv) against the slot's. 3. One GPU: reseat it or its riser at the "
            "next maintenance; all GPUs behind one switch: the switch or the board.",
            ("rate_window", "pcie_replays_per_s", "health_for"),
        ),
        Alert(
            "ChopperGPULinkErrors",
            f"sum by (node, gpu) (rate({C.gpu_link_errors_total}[{w}])) > {p.link_errors_per_s}",
            p.health_for, "warning",
            f"GPU {GPU} has NVLink errors",
            f"GPU {GPU} counted {{{{ $value | humanize }}}} NVLink errors (CRC, replay, recovery) per second over "
            f"{w} for {p.health_for}.",
            "1. NVLink errors slow collectives between the GPUs of a node: check exposed communication on the "
            "Job dashboard. 2. nvidia-smi nvlink -e shows the counters per link: one link is the link or its "
            "bridge, every link of a GPU the GPU. 3. Drain and service the node if the rate persists; an XID 74 "
            "(ChopperGPUXidCritical) is the link failing.",
            ("rate_window", "link_errors_per_s", "health_for"),
        ),
        Alert(
            "ChopperGPUXgmiError",
            f"max by (node, gpu) ({C.gpu_xgmi_error_state}) > 0", "0s", "warning",
            f"GPU {GPU} reports XGMI errors",
            f"GPU {GPU} reports XGMI error status {{{{ $value }}}} (1: one error, 2: several since it was last "
            "cleared).",
            "1. XGMI errors slow collectives between the GPUs of a node: check exposed communication on the Job "
            "dashboard. 2. amd-smi metric --xgmi-err shows the status per GPU; amd-smi reset --xgmierr clears "
            "it. 3. If it comes back after clearing, drain the node and service its XGMI links.",
            (),
        ),
    ]


def _status(p: RuleParams) -> Alert:
    return Alert(
        "ChopperGPUHealthCritical",
        f"max by (node, gpu) ({C.gpu_health_status}) == 2", "0s", "critical",
        f"GPU {GPU} is in critical health",
        f"The agent rates GPU {GPU} critical: an uncorrected ECC error, a critical XID, a page retired or a row "
        "remapped for an uncorrectable error, or a failed remap within the last 10 minutes.",
        "1. The specific alert that fired with it (ChopperGPUXidCritical, ChopperGPUEccUncorrected, "
        "ChopperGPURowRemapFailed) says what happened; follow its runbook. 2. The GPU dashboard's health row "
        "shows which counter moved. 3. This alert catches the causes those rules do not read (retired pages, "
        "remapped rows for uncorrectable errors); route it with them and inhibit it where they fire.",
        (),
        "The status rules are the agent's (docs/HEALTH.md); it turns back to 0 ten minutes after the last event.",
    )


def health_alerts(p: RuleParams) -> list[Alert]:
    """The GPU health alerts, as the rules file lists them."""
    return [*_xid(p), *_ecc(p), *_memory(p), *_links(p), _status(p)]
