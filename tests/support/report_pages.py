"""``chopper report``'s HTML page as tests read it: its figures, a table's cells, and the figures of a recorded run."""
from __future__ import annotations

import re

from chopper.report import figures

# The figures of a recorded run: those that need nothing beyond the run and its attribution.
RUN_FIGURE_KEYS = [spec.key for spec in figures.FIGURES if set(spec.needs) <= {"run", "attribution"}]


def figure_keys(page: str) -> list[str]:
    """The ids of the page's ``<figure>`` elements, in page order."""
    return re.findall(r'<figure id="([^"]+)">', page)


def table_rows(page: str, caption_start: str) -> list[list[str]]:
    """The cells of each body row (the header row left out) of the first table whose caption starts so."""
    body = page.split(f"<caption>{caption_start}", 1)[1].split("</table>", 1)[0]
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body)[1:]]
