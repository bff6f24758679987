"""Small builders over grafana-foundation-sdk shared by the four dashboards.

Every panel reads the dashboard's ``datasource`` variable, so the JSON imports into any Grafana
with a Prometheus data source, and every query keeps and filters on the ``cluster`` label
(``dashboards/cluster.py``) through the ``cluster`` variable every board has. ``Board`` lays
panels out left to right in rows of 24 grid units and numbers them, so each dashboard module lists
only what its panels show. ``drill_down`` links a panel's series to another board, carrying the
data source, cluster and time range.
"""
from __future__ import annotations

from typing import TypeVar

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders import prometheus as pq
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from dashboards.cluster import CLUSTER, filter_cluster, keep_cluster

DATASOURCE = cm.DataSourceRef(type_val="prometheus", uid="${datasource}")
REF_IDS = "ABCDEFGHIJ"
# Grafana's $__rate_interval is at least four scrape intervals: never a rate over a single sample.
RATE = "$__rate_interval"
# The panel builders the helpers below make; each has with_target, id and grid_pos.
PanelBuilder = timeseries.Panel | stat.Panel | table.Panel | heatmap.Panel
PanelT = TypeVar("PanelT", timeseries.Panel, stat.Panel, table.Panel, heatmap.Panel)


def query(expr: str, legend: str = "", instant: bool = False, table_format: bool = False) -> pq.Dataquery:
    """A Prometheus query, per cluster; ``legend`` is a Grafana legend template such as ``{{node}}/{{gpu}}``."""
    q = pq.Dataquery().expr(filter_cluster(keep_cluster(expr))).datasource(DATASOURCE)
    if legend:
        q = q.legend_format(legend)
    q = q.instant() if instant else q.range()
    if table_format:
        q = q.format(PromQueryFormat.TABLE)
    return q


def _with_queries(panel: PanelT, queries: tuple[pq.Dataquery, ...]) -> PanelT:
    for ref, q in zip(REF_IDS, queries, strict=False):
        panel = panel.with_target(q.ref_id(ref))
    return panel


def _legend() -> cb.VizLegendOptions:
    return (cb.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM).calcs([]))


def timeseries_panel(title: str, description: str, unit: str, *queries: pq.Dataquery, stack: bool = False,
                     max_value: float | None = None) -> timeseries.Panel:
    """Lines over time (stacked areas with ``stack``); ``unit`` is a Grafana unit id."""
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
             .legend(_legend()).tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                                        .sort(cm.SortOrder.DESCENDING)))
    if stack:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL)).fill_opacity(60).line_width(0)
    else:
        panel = panel.fill_opacity(5)
    if max_value is not None:
        panel = panel.min(0).max(max_value)
    return _with_queries(panel, queries)


def stat_panel(title: str, description: str, unit: str, *queries: pq.Dataquery) -> stat.Panel:
    """One big number per series: the last value (``0`` when the query returns nothing)."""
    panel = (stat.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit).no_value("0")
             .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
             .graph_mode(cm.BigValueGraphMode.AREA))
    return _with_queries(panel, queries)


def table_panel(title: str, description: str, *queries: pq.Dataquery, rename: dict[str, str] | None = None
                ) -> table.Panel:
    """Instant table queries merged into one row per label set (Grafana's ``merge`` transformation).

    ``rename`` maps Grafana's column names (``Value #B`` for query B) to headers.
    """
    organize = {"excludeByName": {"Time": True, "__name__": True}, "renameByName": rename or {}}
    panel = (table.Panel().title(title).description(description).datasource(DATASOURCE)
             .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
             .with_transformation(dm.DataTransformerConfig(id_val="organize", options=organize)))
    return _with_queries(panel, queries)


def heatmap_panel(title: str, description: str, unit: str, q: pq.Dataquery) -> heatmap.Panel:
    """One row per series (``legend`` names it), colour = value: e.g. rank × time."""
    panel = (heatmap.Panel().title(title).description(description).datasource(DATASOURCE).calculate(False)
             .color(heatmap.HeatmapColorOptions().mode(HeatmapColorMode.SCHEME).scheme("Oranges").steps(64)
                    .exponent(0.5).reverse(False).fill("dark-orange"))
             .y_axis(heatmap.YAxisConfig().unit(unit).axis_placement(cm.AxisPlacement.LEFT))
             .cell_gap(1).show_legend())
    return _with_queries(panel, (q,))


def datasource_variable() -> db.DatasourceVariable:
    return db.DatasourceVariable("datasource").label("Data source").type("prometheus")


def label_variable(name: str, label: str, query_text: str, multi: bool = False) -> db.QueryVariable:
    """A variable filled from ``label_values(...)`` of the chosen clusters; ``multi`` adds All and
    multi-select (use ``=~``)."""
    query_text = filter_cluster(query_text)
    var = (db.QueryVariable(name).label(label).datasource(DATASOURCE).query(query_text).definition(query_text)
           .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.NATURAL_ASC))
    if multi:
        var = var.multi(True).include_all(True).all_value(".*")
    return var


def cluster_variable() -> db.QueryVariable:
    """``cluster``: every value of the label on any series, All by default. All is ``.*``, which
    matches series without the label too, so a Prometheus without it shows everything."""
    text = f"label_values({CLUSTER})"
    return (db.QueryVariable(CLUSTER).label("Cluster").datasource(DATASOURCE).query(text).definition(text)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.NATURAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(selected=True, text="All", value="$__all")))


# What a drill-down link carries to the board it opens, beside its own variables.
CARRIED = f"${{datasource:queryparam}}&${{{CLUSTER}:queryparam}}&${{__url_time_range}}"


def drill_down(panel: PanelT, title: str, uid: str, variables: dict[str, str]) -> PanelT:
    """``panel`` with a data link to board ``uid``: ``variables`` maps the board's variable names to
    Grafana data-link fields (``${__field.labels.node}`` on a time series, ``${__data.fields.node}``
    in a table); the data source, cluster and time range go along."""
    params = "&".join(f"var-{name}={value}" for name, value in variables.items())
    link = db.DashboardLink(title).type(dm.DashboardLinkType.LINK).url(f"/d/{uid}?{params}&{CARRIED}")
    return panel.data_links([link])


class Board:
    """A dashboard under construction: rows of panels placed left to right, 24 units per line.

    Args:
        title: Dashboard title.
        uid: Stable uid (links and provisioning refer to it).
        description: Shown under the title.
    """

    def __init__(self, title: str, uid: str, description: str) -> None:
        self.builder = (db.Dashboard(title).uid(uid).description(description).tags(["chopper"])
                        .refresh("30s").time("now-1h", "now").timezone("browser").editable()
                        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
                        .link(db.DashboardLink("Chopper").type(dm.DashboardLinkType.DASHBOARDS).tags(["chopper"])
                              .as_dropdown(True).include_vars(True).keep_time(True))
                        .with_variable(datasource_variable()).with_variable(cluster_variable()))
        self._next_id = 1
        self._x = 0
        self._y = 0
        self._row_h = 0

    def variable(self, var: Builder) -> Board:
        self.builder = self.builder.with_variable(var)
        return self

    def row(self, title: str) -> Board:
        self._newline()
        self.builder = self.builder.with_row(
            db.Row(title).id(self._take_id()).grid_pos(dm.GridPos(h=1, w=24, x=0, y=self._y)))
        self._y += 1
        return self

    def add(self, panel: PanelBuilder, w: int = 12, h: int = 8) -> Board:
        if self._x + w > 24:
            self._newline()
        panel = panel.id(self._take_id()).grid_pos(dm.GridPos(h=h, w=w, x=self._x, y=self._y))
        self.builder = self.builder.with_panel(panel)
        self._x += w
        self._row_h = max(self._row_h, h)
        return self

    def build(self) -> dm.Dashboard:
        return self.builder.build()

    def _newline(self) -> None:
        self._y += self._row_h
        self._x, self._row_h = 0, 0

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1
