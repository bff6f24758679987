"""Top kernels by total GPU time: the "one GEMM takes half of the GPU time" view."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from chopper.trace.classify import classify_names

TOP_KERNEL_COLUMNS: tuple[str, ...] = (
    "name", "short_name", "kernel_class", "kernel_type", "count", "total_us", "mean_us", "share_pct",
)
SHORT_NAME_CHARS = 60
_RETURN_TYPE = re.compile(r"^(void|__global__|static|inline)\s+")


def short_name(name: str, limit: int = SHORT_NAME_CHARS) -> str:
    """A display name: no return type, template arguments or parameter list, at most ``limit`` chars.

    Algorithm:
        1. Drop a leading ``void`` (C++ kernels are printed with their return type) and every
           ``(anonymous namespace)::``, whose parenthesis would otherwise end the name there.
        2. Drop everything inside ``<...>`` (nesting counted) and from the first top-level ``(`` on.
        3. Cut to ``limit`` characters with an ellipsis (ROCm Tensile names run to 200 characters).

    Args:
        name: The kernel name as the trace writes it.
        limit: Longest result, in characters.

    Returns:
        The shortened name; the full name when shortening would leave nothing.
    """
    text = _RETURN_TYPE.sub("", name.strip()).replace("(anonymous namespace)::", "")
    out: list[str] = []
    depth = 0
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif ch == "(" and depth == 0 and out:
            break
        elif depth == 0:
            out.append(ch)
    short = "".join(out).strip() or name
    return short if len(short) <= limit else short[: limit - 1] + "…"


def top_kernels(kernels: pd.DataFrame, n: int | None = 10) -> pd.DataFrame:
    """Kernels grouped by name, largest total GPU time first.

    Algorithm:
        1. Group kernels (and memcpys / memsets) by name: count, summed duration, mean duration.
        2. Share = summed duration ÷ summed duration of every kernel of the rank, in %. Kernels on
           different streams may overlap, so this is a share of *kernel time*, not of the wall span;
           over all names the shares sum to 100.
        3. Class each name (HTA class and finer type) and shorten it for display; keep the first ``n``.

    Args:
        kernels: ``Trace.kernels`` or the hierarchy frame (``name`` and ``dur_ns`` are used).
        n: Rows to keep; None keeps every name.

    Returns:
        :data:`TOP_KERNEL_COLUMNS`: ``total_us`` and ``mean_us`` in µs, ``share_pct`` in %.
    """
    g = kernels.groupby("name", sort=False)["dur_ns"].agg(["count", "sum"]).reset_index()
    g = g.sort_values(["sum", "name"], ascending=[False, True], ignore_index=True)
    if n is not None:
        total_ns = int(g["sum"].sum())
        g = g.head(n)
    else:
        total_ns = int(g["sum"].sum())
    cls, typ = classify_names(g["name"])
    return pd.DataFrame({
        "name": g["name"].astype(object),
        "short_name": [short_name(str(x)) for x in g["name"]],
        "kernel_class": cls.to_numpy(),
        "kernel_type": typ.to_numpy(),
        "count": g["count"].to_numpy(dtype=np.int64),
        "total_us": g["sum"].to_numpy() / 1000.0,
        "mean_us": g["sum"].to_numpy() / g["count"].to_numpy() / 1000.0,
        "share_pct": 100.0 * g["sum"].to_numpy() / total_ns if total_ns else np.zeros(len(g)),
    }, columns=list(TOP_KERNEL_COLUMNS))
