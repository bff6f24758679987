"""What every figure module shares: the report's inputs (``ReportData``), the registry entry
(``FigureSpec``), the section titles and the figure factory (``new_figure``).

Kept apart from ``figures`` so that the run figures (``figures``) and the trace figures
(``trace_figures``) both build on it and ``figures.FIGURES`` can list both without an import cycle.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from chopper.attribution import Attribution
    from chopper.predict.curve import ScalingCurve
    from chopper.report.traces import TraceSet
    from chopper.runs.rundir import RecordedRun

# The titles of the figure sections, run figures first (``figures``), then trace figures
# (``trace_figures``): a figure names its section, and sections appear in the order of their
# first figure in ``figures.FIGURES``.
ATTRIBUTION_SECTION = "Step-time attribution"
HARDWARE_SECTION = "GPU clocks, power and temperature"
STRAGGLER_SECTION = "Stragglers"
KERNEL_SECTION = "GPU time from traces"
HOST_SECTION = "Launch overhead and idle time from traces"
CROSS_SECTION = "Stragglers from traces"


@dataclass(frozen=True)
class ReportData:
    """Everything a figure may draw from; absent inputs are None.

    Attributes:
        run: The recorded run (devices, samples, markers), or None for a trace-only report.
        attribution: ``attribute_run`` of that run, already filtered to ``--job``.
        traces: The job's Kineto traces with every trace analysis done once
            (``chopper.report.traces.analyze_traces``), or None for a run without traces.
    """

    run: RecordedRun | None = None
    attribution: Attribution | None = None
    traces: TraceSet | None = None

    @cached_property
    def scaling(self) -> ScalingCurve | None:
        """The run's predicted step time at other world sizes (``chopper.predict.curve``), or None
        without a run or where its collectives cannot support a fit."""
        if self.run is None or self.attribution is None:
            return None
        from chopper.predict.curve import run_curve

        return run_curve(self.run, self.attribution.steps)

    @property
    def cross_rank(self) -> TraceSet | None:
        """The traces when they hold two or more ranks (cross-rank figures need that), else None."""
        return self.traces if self.traces is not None and len(self.traces.ranks) >= 2 else None


@dataclass(frozen=True)
class FigureSpec:
    """One registered figure.

    Attributes:
        key: HTML anchor, unique in the report.
        section: Section title; sections appear in the order of their first figure.
        title: Figure heading.
        caption: What the figure shows and how to read it.
        needs: ``ReportData`` fields (or properties, such as ``cross_rank``) that must be present
            (not None) for the figure to be drawn.
        render: Adapter calling the pure figure function with the fields it needs.
    """

    key: str
    section: str
    title: str
    caption: str
    needs: tuple[str, ...]
    render: Callable[[ReportData], Figure]

    def available(self, data: ReportData) -> bool:
        """True when every input the figure needs is present."""
        return all(getattr(data, name) is not None for name in self.needs)


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure on an explicit Agg canvas (``figures`` docstring: no pyplot, no global backend)."""
    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def no_data(fig: Figure, text: str) -> Figure:
    """``fig`` with one centred line of text instead of axes: the input exists but holds nothing to draw."""
    ax = fig.add_subplot()
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return fig
