"""GPU / node dashboard (variables ``node``, ``gpu``): what the hardware did, sample by sample.

Graphics and memory clocks against the maximum, power against the cap, temperature, throttle
residency by cause, engine and matrix activity, link and PCIe traffic, device memory, the GPU's
health (status, XIDs, ECC, memory repair, PCIe replays, NVLink and XGMI errors, memory and
voltage-regulator temperatures; docs/HEALTH.md), and the host's CPU. Every series comes from the
agents' latest sample or health reading at each scrape.
"""
from __future__ import annotations

from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.names import C
from dashboards.panels import RATE, Board, label_variable, query, timeseries_panel
from dashboards.params import RuleParams

UID = "chopper-gpu"
S = '{node=~"$node", gpu=~"$gpu"}'
LEGEND = "{{node}} / {{gpu}}"


def _pair(title: str, description: str, unit: str, value: str, limit: str, limit_name: str) -> timeseries.Panel:
    """A measured series and the limit it runs against, on one panel."""
    return timeseries_panel(title, description, unit, query(f"{value}{S}", LEGEND),
                            query(f"{limit}{S}", f"{limit_name} {LEGEND}"))


def build(p: RuleParams) -> Dashboard:
    def traffic(name: str, legend: str) -> Dataquery:
        return query(f"rate({name}{S}[{RATE}])", f"{legend} {LEGEND}")

    return (
        Board("Chopper / GPU and node", UID, "Clocks, power, temperature, throttling, activity and traffic of "
              "each GPU.")
        .variable(label_variable("node", "Node", f"label_values({C.gpu_info}, node)", multi=True))
        .variable(label_variable("gpu", "GPU", f'label_values({C.gpu_info}{{node=~"$node"}}, gpu)', multi=True))
        .row("Clocks and limits")
        .add(_pair("Graphics clock vs max", "Mean graphics/SM clock over each sample interval, and the device "
                   "maximum.", "hertz", C.gpu_gfx_clock_hertz, C.gpu_gfx_clock_max_hertz, "max"))
        .add(timeseries_panel("Memory clock", "Mean memory clock over each sample interval.", "hertz",
                              query(f"{C.gpu_mem_clock_hertz}{S}", LEGEND)))
        .add(_pair("Power vs cap", "Mean board/socket power over each sample interval, and the power cap.",
                   "watt", C.gpu_power_watts, C.gpu_power_cap_watts, "cap"))
        .add(timeseries_panel("Temperature", "Hotspot temperature.", "celsius",
                              query(f"{C.gpu_temperature_celsius}{S}", LEGEND)))
        .add(timeseries_panel("Throttle residency by cause", "Share of time the clock was held down, by cause "
                              "(power, thermal, current, other).", "percentunit",
                              query(f"sum by (node, gpu, cause) (rate({C.gpu_throttle_seconds_total}{S}[{RATE}]))",
                                    f"{{{{cause}}}} {LEGEND}"), stack=True), w=24)
        .row("Activity and traffic")
        .add(timeseries_panel("Busy and matrix activity", "Graphics/compute engine, matrix-core/tensor and memory "
                              "controller activity over each sample interval.", "percentunit",
                              query(f"{C.gpu_busy_ratio}{S}", f"busy {LEGEND}"),
                              query(f"{C.gpu_matrix_busy_ratio}{S}", f"matrix {LEGEND}"),
                              query(f"{C.gpu_mem_busy_ratio}{S}", f"memory {LEGEND}"),
                              query(f"{C.gpu_counter_flops_ratio}{S}", f"counter FLOPs {LEGEND}"), max_value=1))
        .add(_pair("Device memory", "Device memory in use, and the device's total.", "bytes",
                   C.gpu_memory_used_bytes, C.gpu_memory_total_bytes, "total"))
        .add(timeseries_panel("Link traffic", "XGMI/NVLink bytes per second, sent and received.", "Bps",
                              traffic(C.gpu_link_tx_bytes_total, "tx"), traffic(C.gpu_link_rx_bytes_total, "rx")))
        .add(timeseries_panel("PCIe traffic", "PCIe bytes per second, sent and received.", "Bps",
                              traffic(C.gpu_pcie_tx_bytes_total, "tx"), traffic(C.gpu_pcie_rx_bytes_total, "rx")))
        .row("Health")
        .add(timeseries_panel("Health status", "The agent's health status: 0 healthy, 1 warning (a corrected "
                              "error counter moved or a repair is pending), 2 critical (an uncorrected error, a "
                              "critical XID or a failed remap), over the last 10 minutes (docs/HEALTH.md).", "none",
                              query(f"{C.gpu_health_status}{S}", LEGEND)), w=8)
        .add(timeseries_panel("XID events", "XID events the driver raised, by code, per rate interval.", "short",
                              query(f"sum by (node, gpu, xid) (increase({C.gpu_xid_errors_total}{S}[{RATE}]))",
                                    f"XID {{{{xid}}}} {LEGEND}")), w=8)
        .add(timeseries_panel("ECC errors", "ECC errors per second by severity (the largest of the device total "
                              "and any RAS block, volatile or aggregate count).", "short",
                              query(f"max by (node, gpu, severity) (rate({C.gpu_ecc_errors_total}{S}[{RATE}]))",
                                    f"{{{{severity}}}} {LEGEND}")), w=8)
        .add(timeseries_panel("Memory repair", "HBM rows remapped by class (NVIDIA) and bad pages by status "
                              "(AMD); and 1 while a repair is pending or has failed.", "short",
                              query(f"{C.gpu_remapped_rows}{S}", f"remapped {{{{class}}}} {LEGEND}"),
                              query(f"{C.gpu_bad_pages}{S}", f"bad pages {{{{status}}}} {LEGEND}"),
                              query(f"{C.gpu_memory_repair_state}{S}", f"{{{{state}}}} {LEGEND}")), w=8)
        .add(timeseries_panel("PCIe replays and link errors", "PCIe replays and NAKs, NVLink errors by type, "
                              "per second; and the XGMI error status (AMD: 1 one error, 2 several).", "short",
                              traffic(C.gpu_pcie_replays_total, "PCIe replays"),
                              query(f"sum by (node, gpu, direction) (rate({C.gpu_pcie_naks_total}{S}[{RATE}]))",
                                    f"PCIe NAKs {{{{direction}}}} {LEGEND}"),
                              query(f"sum by (node, gpu, type) (rate({C.gpu_link_errors_total}{S}[{RATE}]))",
                                    f"NVLink {{{{type}}}} {LEGEND}"),
                              query(f"{C.gpu_xgmi_error_state}{S}", f"XGMI status {LEGEND}")), w=8)
        .add(timeseries_panel("Memory and regulator temperature", "Hottest HBM/memory sensor and hottest "
                              "voltage-regulator sensor, where the backend reads them; and the hotspot.",
                              "celsius", query(f"{C.gpu_memory_temperature_celsius}{S}", f"memory {LEGEND}"),
                              query(f"{C.gpu_vr_temperature_celsius}{S}", f"VR {LEGEND}"),
                              query(f"{C.gpu_temperature_celsius}{S}", f"hotspot {LEGEND}")), w=8)
        .row("Host")
        .add(timeseries_panel("Host CPU busy", "CPU busy over the last interval, all cores.", "percentunit",
                              query(f'{C.host_cpu_busy_ratio}{{node=~"$node"}}', "{{node}}"), max_value=1))
        .add(timeseries_panel("Host memory", "Host memory in use and in total.", "bytes",
                              query(f'{C.host_memory_used_bytes}{{node=~"$node"}}', "used {{node}}"),
                              query(f'{C.host_memory_total_bytes}{{node=~"$node"}}', "total {{node}}")))
        .build()
    )
