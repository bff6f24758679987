"""A report page opened in headless Chromium: the DOM it parsed and the colours of a screenshot of it."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("headless Chromium is needed to render the report: install Debian's chromium "
                    "(make apt-deps, or apt-get install -y chromium)")
    return found


def render_in_chromium(page: Path, tmp_path: Path, height: int) -> tuple[str, set[tuple[int, int, int]]]:
    """Open ``page`` in headless Chromium: its parsed DOM, and the colours of a screenshot.

    The screenshot is 1400 pixels wide and ``height`` pixels high. Fails on a non-zero exit, any
    console error from the page, or a screenshot that is not a PNG of the requested size.
    """
    from PIL import Image

    url = page.resolve().as_uri()
    common = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    png = tmp_path / "page.png"
    shot = subprocess.run([*common, "--enable-logging=stderr", "--v=0", f"--screenshot={png}",
                           f"--window-size=1400,{height}", url], capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0, shot.stderr[-2000:]
    page_errors = [line for line in shot.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert page_errors == []
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = Image.open(png).convert("RGB")
    assert image.size == (1400, height)
    return dom.stdout, {c for _, c in image.getcolors(maxcolors=1 << 22) or []}


def assert_filled(colours: set[tuple[int, int, int]], hexcodes: tuple[str, ...]) -> None:
    """Each colour (``#rrggbb``) appears in the screenshot: the figures drawing it rendered."""
    for hexcode in hexcodes:
        rgb = tuple(int(hexcode[i:i + 2], 16) for i in (1, 3, 5))
        assert rgb in colours, f"{hexcode} not in the screenshot: the figures did not render"
    assert len(colours) > 100
