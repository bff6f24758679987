"""The daemons' arena cap: set through glibc's mallopt, never over an operator's MALLOC_ARENA_MAX."""
from __future__ import annotations

import platform

import pytest

from chopper.daemon.malloc import cap_arenas


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's arena limit is glibc's")
def test_glibc_takes_the_cap() -> None:
    assert cap_arenas(env={}) is True


def test_an_operators_malloc_arena_max_stays() -> None:
    assert cap_arenas(env={"MALLOC_ARENA_MAX": "8"}) is False
