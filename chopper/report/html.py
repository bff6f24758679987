"""Assemble a self-contained HTML report: title, table of contents, sections of figures and tables.

The page carries everything inline (CSS in a ``<style>`` element, figures as inline ``<svg>``), so
it can be mailed, attached to a ticket or opened offline; it needs no JavaScript. All text that
comes from data (run paths, job and node names, problem lines) is escaped; only the SVG that
matplotlib writes is inserted as markup.
"""
from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The XML prolog and DOCTYPE of a standalone SVG file are not allowed inside an HTML document.
_SVG_PROLOG = re.compile(r"\A.*?(?=<svg\b)", re.DOTALL)

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto;
       max-width: 1250px; padding: 0 1rem; color: #212121; line-height: 1.4; }
h1 { margin-bottom: 0.2rem; }
.subtitle { color: #616161; margin-top: 0; }
nav { background: #f5f5f5; padding: 0.5rem 1.5rem; border-radius: 6px; }
nav ol { margin: 0.3rem 0; }
section { margin-top: 2.5rem; }
h2 { border-bottom: 2px solid #e0e0e0; padding-bottom: 0.2rem; }
figure { margin: 1.5rem 0; }
figure svg { max-width: 100%; height: auto; }
figcaption { color: #424242; font-size: 0.9rem; max-width: 60rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.85rem; }
caption { text-align: left; font-weight: 600; padding: 0.3rem 0; }
th, td { border: 1px solid #e0e0e0; padding: 0.2rem 0.5rem; }
th { background: #fafafa; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
ul.problems li { font-family: ui-monospace, monospace; font-size: 0.85rem; }
"""


@dataclass(frozen=True)
class FigureBlock:
    """A rendered figure: ``svg`` is markup from ``figure_svg``; title and caption are plain text."""

    key: str
    title: str
    caption: str
    svg: str


@dataclass(frozen=True)
class TableBlock:
    """A table of plain-text cells; ``numeric`` names the columns to right-align."""

    caption: str
    columns: Sequence[str]
    rows: Sequence[Sequence[str]]
    numeric: frozenset[str] = frozenset()


@dataclass(frozen=True)
class TextBlock:
    """A paragraph, or a bulleted list when ``items`` is given; plain text."""

    text: str
    items: Sequence[str] = ()


Block = FigureBlock | TableBlock | TextBlock


@dataclass
class Section:
    """One ``<section>`` with its anchor, heading and blocks in order."""

    key: str
    title: str
    blocks: list[Block] = field(default_factory=list)


def figure_svg(fig: Figure, salt: str) -> str:
    """Render ``fig`` as SVG markup for inlining.

    Args:
        fig: A figure on an Agg canvas.
        salt: Makes the SVG's internal ids (clip paths, glyphs) unique to this figure, so several
            figures inlined in one document cannot resolve each other's ``url(#id)``, and keeps
            them stable across runs (no random salt, no date), so reports diff cleanly.
    """
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt}):
        # dpi only sets the resolution of the few rasterized artists (dense scatters and areas).
        fig.savefig(buf, format="svg", metadata={"Date": None}, dpi=120)
    return _SVG_PROLOG.sub("", buf.getvalue(), count=1)


def _table(block: TableBlock) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in block.columns)
    body = []
    for row in block.rows:
        cells = "".join(
            f'<td class="num">{escape(v)}</td>' if c in block.numeric else f"<td>{escape(v)}</td>"
            for c, v in zip(block.columns, row, strict=True)
        )
        body.append(f"<tr>{cells}</tr>")
    return (f"<table><caption>{escape(block.caption)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def _block(block: Block) -> str:
    if isinstance(block, FigureBlock):
        return (f'<figure id="{escape(block.key)}"><h3>{escape(block.title)}</h3>{block.svg}'
                f"<figcaption>{escape(block.caption)}</figcaption></figure>")
    if isinstance(block, TableBlock):
        return _table(block)
    items = "".join(f"<li>{escape(i)}</li>" for i in block.items)
    return f"<p>{escape(block.text)}</p>" + (f'<ul class="problems">{items}</ul>' if items else "")


def render(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The whole HTML document: heading, table of contents (sections and their figures), sections."""
    toc = []
    for s in sections:
        figures = [b for b in s.blocks if isinstance(b, FigureBlock)]
        sub = "".join(f'<li><a href="#{escape(f.key)}">{escape(f.title)}</a></li>' for f in figures)
        toc.append(f'<li><a href="#{escape(s.key)}">{escape(s.title)}</a>{f"<ol>{sub}</ol>" if sub else ""}</li>')
    body = "\n".join(
        f'<section id="{escape(s.key)}"><h2>{escape(s.title)}</h2>\n' + "\n".join(_block(b) for b in s.blocks)
        + "</section>" for s in sections
    )
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>"
        f"<h1>{escape(title)}</h1><p class=\"subtitle\">{escape(subtitle)}</p>"
        f"<nav><strong>Contents</strong><ol>{''.join(toc)}</ol></nav>\n{body}\n</body></html>\n"
    )
