"""The top of a py-spy profile: where a process's threads spent their samples, by function.

Reads py-spy's ``--format raw`` output (one line per distinct stack: ``frame;frame;...;leaf N``)
and prints, per function, the share of samples whose stack holds it (inclusive) and whose leaf it
is (self). Samples whose leaf is a wait (``threading`` waits, ``select``/``poll``/``epoll``,
``time.sleep``, gRPC's completion-queue polls) are left out: py-spy's ``--nonblocking`` mode
cannot tell a thread blocked in C from one running, and what is asked is where the CPU went.
Frames of the interpreter's start-up and of ``threading``'s bootstrap are left out of the
inclusive list, which they would top with 100 %.

Run: ``python -m benchmarks.profile_top PROFILE.txt [--top N]``.
"""
from __future__ import annotations

import argparse
import collections
from pathlib import Path

WAIT_LEAVES = ("wait (threading.py", "select", "poll", "sleep", "_take (chopper/daemon/stopsignals.py",
               "channel_spin (grpc/_channel.py", "_serve (grpc/_server.py")
PLUMBING = ("threading.py", "concurrent/futures", "<frozen runpy>", "grpc/_server.py:788", "grpc/_server.py:608",
            "chopper/daemon/access.py", "chopper/daemon/grpc_decode.py", "thread (", "process ")


def top(raw: str, k: int = 20) -> list[str]:
    """Markdown lines: the ``k`` functions with the most inclusive and the most self samples."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        frames = stack.split(";")
        if any(w in frames[-1] for w in WAIT_LEAVES):
            continue
        n = int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            if not any(p in frame for p in PLUMBING):
                inclusive[frame] += n
    if not total:
        return ["(no samples off waits)"]
    out = [f"{total} samples off waits.", "", "| inclusive | function |", "|---|---|"]
    out += [f"| {100 * n / total:.1f}% | `{f}` |" for f, n in inclusive.most_common(k)]
    out += ["", "| self | function |", "|---|---|"]
    out += [f"| {100 * n / total:.1f}% | `{f}` |" for f, n in own.most_common(k)]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="py-spy record --format raw output")
    parser.add_argument("--top", type=int, default=20, help="functions per list")
    args = parser.parse_args(argv)
    print("\n".join(top(args.profile.read_text(), args.top)))


if __name__ == "__main__":
    main()
