"""Start-up inputs that reach the OS: real daemons refuse each one in words naming the setting and the fix.

Every case starts a real ``chopper-agent`` or ``chopper-aggregator`` process on a bad path or
address (the cases run side by side: each process spends seconds importing) and checks that it
exits 2 with one line naming the setting, the path or address and the fix, that no gRPC or
``Errno`` text reaches the user, and that what was at the path is still there, byte for byte.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chopper.demo.run import free_port
from tests.support.hazards import HazardOutcome

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0


def agent_argv(socket_path: Path | str) -> list[str]:
    return [sys.executable, "-m", "agent", "--node", "n", "--backend", "simulated", "--sim-gpus", "1",
            "--socket-path", str(socket_path), "--metrics-listen", f"127.0.0.1:{free_port()}"]


def aggregator_argv(listen: str) -> list[str]:
    return [sys.executable, "-m", "aggregator.main", "--listen", listen, "--metrics-listen", f"127.0.0.1:{free_port()}"]


# What a daemon prints when another process took the /metrics port free_port() gave it.
METRICS_TAKEN = "metrics_listen: cannot bind"


def start(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run_all(cases: dict[str, Callable[[], list[str]]]) -> dict[str, tuple[int | None, str]]:
    """Start every case's process at once; (exit status, stderr) of each, None where it kept running.

    free_port() releases the port it found, so a parallel process can take it first: such a case
    is run again with a new argv (a new port), at most twice.
    """
    out: dict[str, tuple[int | None, str]] = {}
    todo = dict(cases)
    for _ in range(3):
        procs = {name: start(argv()) for name, argv in todo.items()}
        for name, proc in procs.items():
            try:
                _, err = proc.communicate(timeout=START_TIMEOUT_S)
                out[name] = (proc.returncode, err.decode())
            except subprocess.TimeoutExpired:  # it served: the refusal this test wants did not happen
                proc.kill()
                out[name] = (None, proc.communicate()[1].decode())
        todo = {name: todo[name] for name in todo if METRICS_TAKEN in out[name][1]}
        if not todo:
            break
    return out


def serves_socket(path: Path) -> bool:
    """Whether an agent on ``path`` comes to answer there; stops it either way.

    A stale socket accepts no connection, so an answer means the agent replaced it (the inode
    number is no evidence: the file system may give the new socket the old one's).
    """
    from chopper.runs import consumer

    for _ in range(3):
        proc = start(agent_argv(path))
        deadline = time.monotonic() + START_TIMEOUT_S
        served = False
        while not served and time.monotonic() < deadline and proc.poll() is None:
            try:
                served = bool(consumer.wait_for_info(f"unix://{path}", 1.0))
            except (OSError, consumer.AgentUnreachable):
                time.sleep(0.1)
        if proc.poll() is None:
            proc.terminate()
        if served or METRICS_TAKEN not in proc.communicate(timeout=15)[1].decode():
            return served
    return False


def refusal(stderr: str, daemon: str) -> str:
    """The daemon's one-line refusal, checked free of gRPC's and Python's raw texts."""
    lines = [line for line in stderr.splitlines() if line.startswith(f"{daemon}: ")]
    assert len(lines) == 1, stderr
    for raw in ("Errno", "Traceback", "add_port.cc", "GRPC_VERBOSITY", "Failed to bind"):
        assert raw not in stderr, stderr
    return lines[0]


@pytest.fixture
def listening(tmp_path: Path) -> Iterator[Path]:
    """A unix socket some process listens on (not an agent)."""
    path = tmp_path / "busy.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    yield path
    server.close()


@pytest.mark.slow
@pytest.mark.hazard(item=1, input="--socket-path naming a 64 KiB regular file, a symlink to a file, a directory, "
                    "a socket another process listens on",
                    promise="only a stale socket is replaced; anything else is a start-up error naming the path, "
                    "and is left untouched")
def test_agent_never_removes_what_is_not_a_stale_socket(tmp_path: Path, listening: Path,
                                                        hazard: HazardOutcome) -> None:
    data = os.urandom(64 * 1024)
    regular = tmp_path / "agent.sock"  # a unit file's typo pointing at someone's data
    regular.write_bytes(data)
    target = tmp_path / "notes.txt"
    target.write_bytes(data)
    link = tmp_path / "link.sock"
    link.symlink_to(target)
    directory = tmp_path / "run"
    (directory / "inside").mkdir(parents=True)
    stale = tmp_path / "stale.sock"  # a killed agent's leftover: the one thing the agent may replace
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(str(stale))
    leftover.close()
    digest = hashlib.sha256(data).hexdigest()

    results = run_all({name: functools.partial(agent_argv, path) for name, path in (
        ("file", regular), ("symlink", link), ("directory", directory), ("listening", listening))})

    for name, path in (("file", regular), ("symlink", link), ("directory", directory), ("listening", listening)):
        rc, err = results[name]
        assert rc == 2, (name, rc, err)
        line = refusal(err, "chopper-agent")
        assert f"socket_path: {path} " in line, line
    assert "is a regular file of 65536 bytes, not a socket" in refusal(results["file"][1], "chopper-agent")
    assert f"is a symbolic link to '{target}'" in refusal(results["symlink"][1], "chopper-agent")
    assert "is a directory" in refusal(results["directory"][1], "chopper-agent")
    assert "served by another running agent" in refusal(results["listening"][1], "chopper-agent")
    # Left as they were, byte for byte.
    assert hashlib.sha256(regular.read_bytes()).hexdigest() == digest and not regular.is_symlink()
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == digest
    assert (directory / "inside").is_dir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(listening))  # its owner still serves it
    assert serves_socket(stale)  # the stale socket, and only it, was replaced
    hazard.outcome = ("4 of 4 refused with exit 2 naming socket_path and the path; the 65,536-byte file and the "
                      "link's target kept (same sha256), the link and the directory kept, the listening socket still "
                      "accepts; a stale socket is still replaced (that agent served)")


@pytest.mark.slow
@pytest.mark.hazard(item=14, input="socket_path too long for AF_UNIX (150 bytes), under a regular file, a FIFO, in a "
                    "directory the agent's user cannot write",
                    promise="every socket path that cannot be served is refused at start naming socket_path and the "
                    "fix, never gRPC's text or a raw Errno")
def test_agent_socket_paths_that_cannot_be_served(tmp_path: Path, hazard: HazardOutcome) -> None:
    from agent.unix_socket import SocketPathError, prepare_socket_path

    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be\n")
    fifo = tmp_path / "agent.fifo"
    os.mkfifo(fifo)
    expected = {
        tmp_path / ("d" * 150) / "agent.sock": "bytes; a unix socket path holds at most 94 here",
        blocker / "agent.sock": "cannot be made: a file that is not a directory is in the way",
        fifo: "is a FIFO, not a socket",
    }
    refused = {}
    for path, text in expected.items():  # what the agent runs before it binds, in process: fast
        with pytest.raises(SocketPathError) as err:
            prepare_socket_path(path)
        refused[path] = str(err.value)
        assert refused[path].startswith("socket_path: ") and text in refused[path], refused[path]
        assert "choose another socket_path" in refused[path]
    assert not (tmp_path / ("d" * 150)).exists() and blocker.read_text().startswith("a file") and fifo.is_fifo()
    if os.geteuid() == 0 and shutil.which("setpriv"):
        # A real agent as root without the capabilities that pass over file permissions: bound by them as any
        # user is, and still able to run this checkout's interpreter (under /root, which others cannot enter).
        unwritable = tmp_path / "run"
        unwritable.mkdir(mode=0o755)
        os.chown(unwritable, 65534, 65534)
        rc, err_text = run_all({"unwritable": lambda: [
            "setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--",
            *agent_argv(unwritable / "agent.sock")]})["unwritable"]
        assert rc == 2, err_text
        line = refusal(err_text, "chopper-agent")
        assert f"socket_path: the agent's user (uid 0) cannot create its socket in {unwritable}" in line, line
        refused[unwritable] = line
    hazard.outcome = (f"{len(refused)} of {len(refused)} refused naming socket_path, the reason and the fix "
                      "(too long: 150 bytes of at most 94; a file in the way; a FIFO; an unwritable directory: a real "
                      "agent exited 2); no gRPC text, no Errno; the file and the FIFO kept")


@pytest.mark.slow
@pytest.mark.hazard(item=14, input="aggregator listen: a port another process holds, an address of another machine, "
                    "a host name that does not resolve",
                    promise="refused at start naming listen, the cause and the fix, never gRPC's text")
def test_aggregator_listen_addresses_that_cannot_be_bound(hazard: HazardOutcome) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        busy = holder.getsockname()[1]
        results = run_all({
            "in use": lambda: aggregator_argv(f"127.0.0.1:{busy}"),
            "not here": lambda: aggregator_argv(f"192.0.2.1:{free_port()}"),  # TEST-NET-1: never a local address
            "no such host": lambda: aggregator_argv(f"no-such-host.invalid:{free_port()}"),
        })
    expected = {
        "in use": f"port {busy} is in use by another process",
        "not here": "192.0.2.1 is not an address of this machine",
        "no such host": "the host 'no-such-host.invalid' does not resolve",
    }
    for name, text in expected.items():
        rc, err = results[name]
        assert rc == 2, (name, rc, err)
        line = refusal(err, "chopper-aggregator")
        assert line.startswith("chopper-aggregator: listen: cannot bind ") and text in line, line
        assert "is the port in use?" not in line  # the old guess, wrong for two of these
    hazard.outcome = "3 of 3 refused with exit 2 in one line naming listen, the real cause and the fix; no gRPC text"


@pytest.mark.slow
@pytest.mark.hazard(item=14, input="the agent's grpc_listen and either daemon's metrics_listen: a port another process "
                    "holds, a host name that does not resolve",
                    promise="refused at start naming the setting, the cause and the fix, as listen is")
def test_every_tcp_listener_names_why_it_cannot_bind(tmp_path: Path, hazard: HazardOutcome) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        busy = holder.getsockname()[1]
        results = run_all({
            "agent grpc_listen in use": lambda: [*agent_argv(tmp_path / "a.sock"), "--grpc-listen",
                                                 f"127.0.0.1:{busy}"],
            "agent grpc_listen no such host": lambda: [*agent_argv(tmp_path / "b.sock"), "--grpc-listen",
                                                       f"no-such-host.invalid:{free_port()}"],
            "agent metrics_listen in use": lambda: [*agent_argv(tmp_path / "c.sock"), "--metrics-listen",
                                                    f"127.0.0.1:{busy}"],
            "aggregator metrics_listen in use": lambda: [*aggregator_argv(f"127.0.0.1:{free_port()}"),
                                                         "--metrics-listen", f"127.0.0.1:{busy}"],
        })
    expected = {
        "agent grpc_listen in use": ("chopper-agent", "grpc_listen: cannot bind", f"port {busy} is in use"),
        "agent grpc_listen no such host": ("chopper-agent", "grpc_listen: cannot bind", "does not resolve"),
        "agent metrics_listen in use": ("chopper-agent", "metrics_listen: cannot bind", f"port {busy} is in use"),
        "aggregator metrics_listen in use": ("chopper-aggregator", "metrics_listen: cannot bind",
                                             f"port {busy} is in use"),
    }
    for name, (daemon, setting, cause) in expected.items():
        rc, err = results[name]
        assert rc == 2, (name, rc, err)
        line = refusal(err, daemon)
        assert setting in line and cause in line and "is the port in use?" not in line, (name, line)
    hazard.outcome = (f"{len(expected)} of {len(expected)} refused with exit 2 in one line naming the setting, the "
                      "real cause and the fix (before: grpc_listen said 'is the port in use?' for any cause)")
