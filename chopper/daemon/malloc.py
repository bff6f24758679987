"""glibc's malloc arenas, capped for a daemon of many threads.

glibc gives a thread that finds the arenas busy an arena of its own, up to 8 per core, and an
arena keeps the memory freed into it. The daemons serve every gRPC stream on a thread of its own
(``chopper.daemon.serving``): an agent beside 64 trainers runs about 140 threads, and its resident
set was 6-7 MiB larger with glibc's default than with two arenas, for the same CPU
(``benchmarks/bench_load_held.py``: 113-114 against 107 MiB, 65 % against 63 % of a core).
The daemons' threads allocate little and mostly hold the GIL while they do, so two arenas see
little contention.
"""
from __future__ import annotations

import ctypes
import os

# mallopt's parameter number for the arena limit (glibc malloc.h M_ARENA_MAX).
_M_ARENA_MAX = -8
DAEMON_ARENAS = 2


def cap_arenas(arenas: int = DAEMON_ARENAS, env: dict[str, str] | None = None) -> bool:
    """Limit glibc's malloc to ``arenas`` arenas from now on, unless ``MALLOC_ARENA_MAX`` says otherwise.

    Call it before the daemon starts its threads: arenas already made stay. An operator's
    ``MALLOC_ARENA_MAX`` (read by glibc itself at start) is left in force.

    Returns:
        True when the limit was set; False when the C library has no such setting (mallopt refused or
        missing), or when the environment sets one.
    """
    if "MALLOC_ARENA_MAX" in (os.environ if env is None else env):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter is linked with
    except (OSError, AttributeError):  # a libc without mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))
