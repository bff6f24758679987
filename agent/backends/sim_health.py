"""Health and error counters of the simulated backend, and the events an operator schedules on them.

Each simulated chip reports the counter set of its model's vendor (``counter_keys``), every
counter starting at 0 when the backend opens (NVIDIA's lifetime ``aggregate`` corrected ECC count
at a small per-chip constant: errors from before this boot):

- NVIDIA (H100, H200, ...): ``ecc_corrected`` / ``ecc_uncorrected`` in the ``volatile`` and
  ``aggregate`` windows (detail ``total``, as NVML counts them), ``remapped_rows`` (correctable,
  uncorrectable), ``remap_pending``, ``remap_failed``, ``pcie_replay``, ``link_crc`` (flit, data),
  ``link_replay``, ``link_recovery``, and ``xid`` per code once that XID happened.
- AMD (MI300X, ...): ``ecc_corrected`` / ``ecc_uncorrected`` / ``ecc_deferred`` per RAS block
  (``AMD_RAS_BLOCKS``) and ``total``, in the ``volatile`` window (amdsmi counts since the driver
  loaded), ``pcie_replay``, ``pcie_nak_sent``, ``pcie_nak_received``, ``xgmi_error`` and
  ``bad_pages`` (retired, pending).

Events (``sim_health_events``), each ``GPU:KIND:AT_S[:COUNT[:DETAIL]]``: chip ``GPU`` gets
``COUNT`` (default 1) errors of ``KIND`` ``AT_S`` seconds after the backend's first sample. Counters
and gauges grow as a burst over the following ``BURST_NS``: at ``t`` after the first sample a
counter has ``ceil(COUNT · min(1, (t − AT_S) / BURST_S))`` of them, so the first error is seen at
the first reading after ``AT_S``. States (``remap_pending``, ``remap_failed``, ``xgmi_error``)
are set from ``AT_S`` on (``xgmi_error`` 1 for one error, 2 for several). DETAIL is the XID code
(required for ``xid``), the RAS block of an AMD ECC error (default ``umc``; ``total`` follows
every block), the CRC type of ``link_crc`` (default ``flit``), the class of ``remapped_rows``
(default ``correctable``) or the status of ``bad_pages`` (default ``retired``). As the drivers
do, an uncorrected ECC error on an NVIDIA model also sets ``remap_pending`` (the row is remapped
at the next reset, which is never simulated), and an XID 48, 94 or 95 (double-bit, contained,
uncontained ECC error) comes with an uncorrected ECC error each.

Nothing else follows from an event: a GPU correcting errors computes as fast as before. The point
is that its steps are flagged ``gpu_errors`` and its health alert fires.

Cost: a reading per chip is a loop over its counters (≤ 30) and its scheduled events, once per
``HEALTH_INTERVAL_NS``; a chip whose counters did not change returns its previous tuple.
This module imports only the standard library (``agent.config`` checks events with it).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from chopper.schema import ERROR_KINDS, ErrorCount

HEALTH_INTERVAL_NS = 10**9
BURST_NS = 2 * 10**9
AMD_RAS_BLOCKS = ("umc", "gfx", "sdma", "mmhub", "xgmi_wafl")
# XIDs that NVIDIA's catalog raises for an uncorrectable ECC error: double-bit error, contained and
# uncontained ECC error.
ECC_XIDS = frozenset({"48", "94", "95"})
AGGREGATE_CORRECTED_MAX = 5  # the per-chip lifetime count an NVIDIA chip starts with is below this

_ECC = ("ecc_corrected", "ecc_uncorrected")
NVIDIA_KINDS = ("xid", *_ECC, "remapped_rows", "remap_pending", "remap_failed", "pcie_replay", "link_crc",
                "link_replay", "link_recovery")
AMD_KINDS = (*_ECC, "ecc_deferred", "pcie_replay", "pcie_nak_sent", "pcie_nak_received", "xgmi_error", "bad_pages")
# Kinds with a detail: its choices, the first the default ("" detail: none).
_DETAILS: dict[str, tuple[str, ...]] = {
    "link_crc": ("flit", "data"), "remapped_rows": ("correctable", "uncorrectable"),
    "bad_pages": ("retired", "pending"),
}
_VENDOR_NAMES = {"amd": "AMD", "nvidia": "NVIDIA"}
_FORM = "GPU:KIND:AT_S[:COUNT[:DETAIL]], e.g. 3:ecc_corrected:20:50 or 1:xid:30:1:79"

Key = tuple[str, str, str]  # (kind, window, detail) of ErrorCount


def vendor_kinds(vendor: str) -> tuple[str, ...]:
    """The ``ERROR_KINDS`` a simulated chip of ``vendor`` (``amd`` or ``nvidia``) reports."""
    return AMD_KINDS if vendor == "amd" else NVIDIA_KINDS


def counter_keys(vendor: str) -> tuple[Key, ...]:
    """Every counter a chip of ``vendor`` reports from the start (XIDs join once one happened)."""
    if vendor == "amd":
        ecc = [(k, "volatile", b) for k in (*_ECC, "ecc_deferred") for b in (*AMD_RAS_BLOCKS, "total")]
        rest = [(k, "", "") for k in ("pcie_replay", "pcie_nak_sent", "pcie_nak_received", "xgmi_error")]
        return (*ecc, *rest, *(("bad_pages", "", d) for d in _DETAILS["bad_pages"]))
    ecc = [(k, w, "total") for k in _ECC for w in ("volatile", "aggregate")]
    rows = [("remapped_rows", "", d) for d in _DETAILS["remapped_rows"]]
    states = [(k, "", "") for k in ("remap_pending", "remap_failed", "pcie_replay")]
    links = [("link_crc", "", d) for d in _DETAILS["link_crc"]]
    return (*ecc, *rows, *states, *links, ("link_replay", "", ""), ("link_recovery", "", ""))


@dataclass(frozen=True, slots=True)
class ScheduledError:
    """One ``sim_health_events`` entry: ``count`` errors of ``kind`` on chip ``gpu`` from ``at_s`` on."""

    gpu: int
    kind: str
    at_s: float
    count: int
    detail: str


def parse_event(entry: str, vendor: str, gpus: int) -> ScheduledError:
    """Parse one ``GPU:KIND:AT_S[:COUNT[:DETAIL]]`` entry for ``gpus`` chips of ``vendor``.

    Raises:
        ValueError: The message quotes the entry, says what is wrong and what to write.
    """

    def bad(why: str) -> ValueError:
        return ValueError(f"entry {entry!r} {why}; write {_FORM}")

    parts = entry.strip().split(":")
    if not 3 <= len(parts) <= 5:
        raise bad(f"has {len(parts)} field(s), not 3 to 5")
    gpu_text, kind, at_text, count_text, detail = (*parts, "", "")[:5]
    if not gpu_text.isdigit() or not int(gpu_text) < gpus:
        raise bad(f"names GPU {gpu_text!r}, not one of 0..{gpus - 1}")
    kinds = vendor_kinds(vendor)
    if kind not in kinds:
        what = (f"which a simulated {_VENDOR_NAMES.get(vendor, vendor)} GPU does not report" if kind in ERROR_KINDS
                else "not one of chopper.schema.ERROR_KINDS")
        raise bad(f"has KIND {kind!r}, {what}; use one of {', '.join(kinds)}")
    try:
        at_s = float(at_text)
    except ValueError:
        at_s = math.nan
    if not 0 <= at_s < 1e9:
        raise bad(f"has AT_S {at_text!r}, not a number of seconds from 0 on")
    if count_text and not (count_text.isdigit() and 1 <= int(count_text) <= 1_000_000):
        raise bad(f"has COUNT {count_text!r}, not a whole number from 1 to 1000000")
    return ScheduledError(int(gpu_text), kind, at_s, int(count_text or 1), _detail(kind, detail, vendor, bad))


def _detail(kind: str, detail: str, vendor: str, bad: Callable[[str], ValueError]) -> str:
    """The entry's DETAIL checked for its kind, or the kind's default."""
    if kind == "xid":
        if not (detail.isdigit() and 0 < int(detail) < 1000):
            raise bad(f"has XID code {detail!r}; an xid event needs the code as DETAIL, e.g. 79")
        return str(int(detail))
    if kind.startswith("ecc_"):
        blocks = AMD_RAS_BLOCKS if vendor == "amd" else ("total",)
        if detail and detail not in (*blocks, "total"):
            raise bad(f"has ECC block {detail!r}; use one of {', '.join(blocks)}")
        return detail if detail and detail != "total" else blocks[0]
    choices = _DETAILS.get(kind, ("",))
    if detail and detail not in choices:
        raise bad(f"has DETAIL {detail!r}, which {kind} does not take" if choices == ("",)
                  else f"has DETAIL {detail!r}; {kind} takes one of {', '.join(choices)}")
    return detail or choices[0]


def parse_events(entries: Iterable[str], vendor: str, gpus: int) -> tuple[ScheduledError, ...]:
    """Parse every entry (``parse_event``); the first bad one raises ``ValueError``."""
    return tuple(parse_event(e, vendor, gpus) for e in entries)


@dataclass(frozen=True, slots=True)
class _Growth:
    """``count`` of counter ``key`` from ``at_ns`` on, over ``BURST_NS`` unless ``state``."""

    key: Key
    at_ns: int
    count: int
    state: bool


def _growths(e: ScheduledError, vendor: str) -> list[_Growth]:
    """What one event adds to a chip's counters, with what the driver adds alongside it."""
    at = round(e.at_s * 1e9)
    if e.kind in ("remap_pending", "remap_failed", "xgmi_error"):
        return [_Growth((e.kind, "", ""), at, 1 if e.kind != "xgmi_error" or e.count == 1 else 2, True)]
    if e.kind == "xid":
        out = [_Growth(("xid", "", e.detail), at, e.count, False)]
        if e.detail in ECC_XIDS:
            out += _growths(ScheduledError(e.gpu, "ecc_uncorrected", e.at_s, e.count, "total"), vendor)
        return out
    if e.kind.startswith("ecc_"):
        windows = ("volatile",) if vendor == "amd" else ("volatile", "aggregate")
        blocks = ("total",) if e.detail == "total" else (e.detail, "total")
        out = [_Growth((e.kind, w, b), at, e.count, False) for w in windows for b in blocks]
        if e.kind == "ecc_uncorrected" and vendor != "amd":
            out.append(_Growth(("remap_pending", "", ""), at, 1, True))
        return out
    return [_Growth((e.kind, "", e.detail), at, e.count, False)]


class ChipHealth:
    """The health counters of one simulated chip, read at a time since the backend's first sample.

    Args:
        vendor: ``amd`` or ``nvidia`` (the model's vendor).
        events: This chip's scheduled errors.
        aggregate_corrected: NVIDIA's lifetime corrected ECC count at start.
        chip_wide: Mark every counter ``chip_wide`` (the chip is partitioned).
    """

    def __init__(self, vendor: str, events: Sequence[ScheduledError], aggregate_corrected: int = 0,
                 chip_wide: bool = False) -> None:
        self._base: dict[Key, int] = dict.fromkeys(counter_keys(vendor), 0)
        if vendor != "amd":
            self._base[("ecc_corrected", "aggregate", "total")] = aggregate_corrected
        self._growths = [g for e in events for g in _growths(e, vendor)]
        self._chip_wide = chip_wide
        self._last: tuple[tuple[Key, int], ...] | None = None
        self._errors: tuple[ErrorCount, ...] = ()

    def read(self, elapsed_ns: int) -> tuple[ErrorCount, ...]:
        """Every counter ``elapsed_ns`` after the backend's first sample (a previous tuple if unchanged)."""
        values = dict(self._base)
        for g in self._growths:
            if elapsed_ns <= g.at_ns:
                continue
            if g.state:  # set; XGMI's status counts one error (1) or several (2)
                v = values[g.key]
                values[g.key] = min(2, v + g.count) if g.key[0] == "xgmi_error" else max(v, g.count)
            else:
                done = min(1.0, (elapsed_ns - g.at_ns) / BURST_NS)
                values[g.key] = values.get(g.key, 0) + math.ceil(g.count * done)
        items = tuple(values.items())
        if items != self._last:
            self._last = items
            wide = self._chip_wide
            self._errors = tuple(ErrorCount(k, w, d, float(v), wide) for (k, w, d), v in items)
        return self._errors
