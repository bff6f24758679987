"""Two network namespaces joined by a rate-limited veth pair: a slow link between two real processes.

A multi-rank job on one machine talks over loopback at memory speed, so its communication costs
next to nothing. ``VethLink`` puts each side of a job in its own network namespace, joined by a
veth pair whose two ends each send at a ``tc`` token-bucket rate, so the job's traffic crosses a
link of known bandwidth.

What one ``VethLink`` creates (``NAME`` = ``chx`` + 8 random hex digits, unique per link, so
parallel runs never share a name; interface names stay within the kernel's 15 characters):

* network namespaces ``NAMEa`` and ``NAMEb`` (``ip netns add``), loopback up in each;
* a veth pair, end ``NAMEa`` in namespace ``NAMEa`` with ``10.213.0.1/30`` and end ``NAMEb`` in
  namespace ``NAMEb`` with ``10.213.0.2/30``, MTU ``MTU``: the addresses exist only inside those
  namespaces, nothing is routed or reachable beyond the pair;
* on each end, a root ``tbf`` qdisc at the link's rate (``set_rate`` replaces it), so each
  direction is limited separately, as on a full-duplex link;
* the processes started with ``popen`` (``ip netns exec``, which execs the command itself, so the
  pid is the command's).

What ``close`` removes, in this order, whatever happened before (it runs from ``with``, on a setup
failure and at interpreter exit, and twice is harmless): each process it started that still runs
(SIGKILL by pid, then reaped), every process still inside the namespaces (``ip netns pids``: a
launcher's children outlive it), then both namespaces (``ip netns delete``, which destroys the veth
ends inside them and their qdiscs). Nothing outside those two namespaces is touched. Every ``ip`` /
``tc`` call has a timeout. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2;
``unavailable()`` says why a machine cannot, after trying it once for real.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from types import TracebackType
from typing import Any

ADDRESSES = ("10.213.0.1", "10.213.0.2")
PREFIX_LEN = 30
COMMAND_TIMEOUT_S = 10.0
# Loopback-sized frames: the kernel's per-packet work for the emulated link (both TCP stacks, veth,
# tc) runs on the CPUs of the processes that talk over it; with 1500-byte frames a 2-rank gloo
# all-reduce of 3.5 MB costs each rank ~40 ms of CPU, with 65000-byte frames ~6 ms.
MTU = 65000
# tbf: the bucket holds at least 1 ms of traffic and two full frames, so the rate is the limit rather
# than the bucket; a 50 ms queue bounds the delay a full queue adds.
MIN_BURST_BYTES = 2 * 65536
QUEUE_LATENCY = "50ms"


class NetnsError(RuntimeError):
    """An ``ip`` or ``tc`` command failed; the message holds the command and its stderr."""


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed ({result.returncode}): {result.stderr.strip()}")


class VethLink:
    """Two namespaces ``a`` and ``b`` joined by a veth pair at ``rate_bit_s`` each way (module docstring).

    Args:
        rate_bit_s: Rate of each direction, bit/s.

    Attributes:
        name: The unique prefix of the namespaces and interfaces.
        namespaces: ``(a, b)`` namespace names; ``interfaces`` the veth end inside each.
        addresses: ``(a, b)`` IPv4 addresses, reachable only from inside the two namespaces.
    """

    def __init__(self, rate_bit_s: float) -> None:
        self.name = f"chx{secrets.token_hex(4)}"
        self.namespaces = (f"{self.name}a", f"{self.name}b")
        self.interfaces = self.namespaces  # each end is named as its namespace
        self.addresses = ADDRESSES
        self.rate_bit_s = 0.0
        self._made: list[str] = []  # namespaces created so far, removed by close()
        self._procs: list[subprocess.Popen[Any]] = []
        self._closed = False
        atexit.register(self.close)
        try:
            self._create()
            self.set_rate(rate_bit_s)
        except BaseException:
            self.close()
            raise

    def _create(self) -> None:
        for ns in self.namespaces:
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        a, b = self.namespaces
        # Created inside namespace a with its peer placed in b at once: no end ever exists in the
        # namespace this process runs in.
        _run("ip", "-n", a, "link", "add", a, "type", "veth", "peer", "name", b, "netns", b)
        for ns, ifname, address in zip(self.namespaces, self.interfaces, self.addresses, strict=True):
            _run("ip", "-n", ns, "addr", "add", f"{address}/{PREFIX_LEN}", "dev", ifname)
            _run("ip", "-n", ns, "link", "set", ifname, "mtu", str(MTU), "up")

    def set_rate(self, rate_bit_s: float) -> None:
        """Limit each direction to ``rate_bit_s`` bit/s (replaces the previous limit)."""
        if rate_bit_s <= 0:
            raise ValueError(f"rate_bit_s must be positive, got {rate_bit_s!r}")
        burst = max(MIN_BURST_BYTES, int(rate_bit_s / 8 / 1000))
        for ns, ifname in zip(self.namespaces, self.interfaces, strict=True):
            _run("tc", "-n", ns, "qdisc", "replace", "dev", ifname, "root", "tbf", "rate", f"{int(rate_bit_s)}bit",
                 "burst", str(burst), "latency", QUEUE_LATENCY)
        self.rate_bit_s = float(rate_bit_s)

    def popen(self, side: int, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside namespace ``side`` (0 for a, 1 for b); ``close`` kills it if it still runs."""
        proc: subprocess.Popen[Any] = subprocess.Popen(["ip", "netns", "exec", self.namespaces[side], *argv],
                                                       **kwargs)
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        """Kill the processes still running, then delete both namespaces (module docstring)."""
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(COMMAND_TIMEOUT_S)
        self.kill_inside()
        for ns in self._made:
            with contextlib.suppress(NetnsError, subprocess.TimeoutExpired):
                _run("ip", "netns", "delete", ns)
        atexit.unregister(self.close)

    def kill_inside(self) -> int:
        """SIGKILL every process still inside either namespace; how many.

        What ``popen`` started is not all: a launcher's children (torchrun's workers) run in sessions
        of their own and outlive it, and a namespace that still holds a process lingers after
        ``ip netns delete``.
        """
        killed = 0
        for ns in self._made:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                        timeout=COMMAND_TIMEOUT_S, check=False).stdout.split()
                for pid in listed:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                        killed += 1
        return killed

    def __enter__(self) -> VethLink:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def unavailable() -> str | None:
    """Why this machine cannot make a ``VethLink`` (not root, no iproute2, refused), or None when it can.

    Tries it for real: one link is created at 100 Mbit/s and removed.
    """
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth and tc need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found: install iproute2"
    try:
        VethLink(100e6).close()
    except (NetnsError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create network namespaces with a rate-limited veth pair here: {exc}"
    return None
