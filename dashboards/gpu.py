"""GPU / node dashboard (variables ``node``, ``gpu``): what the hardware did, sample by sample.

Graphics and memory clocks against the maximum, power against the cap, temperature, throttle
residency by cause, engine and matrix activity, link and PCIe traffic, device memory, and the
host's CPU. Every series comes from the agents' latest sample at each scrape.
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
                              query(f"{C.gpu_mem_busy_ratio}{S}", f"memory {LEGEND}"), max_value=1))
        .add(_pair("Device memory", "Device memory in use, and the device's total.", "bytes",
                   C.gpu_memory_used_bytes, C.gpu_memory_total_bytes, "total"))
        .add(timeseries_panel("Link traffic", "XGMI/NVLink bytes per second, sent and received.", "Bps",
                              traffic(C.gpu_link_tx_bytes_total, "tx"), traffic(C.gpu_link_rx_bytes_total, "rx")))
        .add(timeseries_panel("PCIe traffic", "PCIe bytes per second, sent and received.", "Bps",
                              traffic(C.gpu_pcie_tx_bytes_total, "tx"), traffic(C.gpu_pcie_rx_bytes_total, "rx")))
        .row("Host")
        .add(timeseries_panel("Host CPU busy", "CPU busy over the last interval, all cores.", "percentunit",
                              query(f'{C.host_cpu_busy_ratio}{{node=~"$node"}}', "{{node}}"), max_value=1))
        .add(timeseries_panel("Host memory", "Host memory in use and in total.", "bytes",
                              query(f'{C.host_memory_used_bytes}{{node=~"$node"}}', "used {{node}}"),
                              query(f'{C.host_memory_total_bytes}{{node=~"$node"}}', "total {{node}}")))
        .build()
    )
