"""The agent's unix socket as other local users meet it: the kernel refuses an outsider, a group member is served.

The agent runs as the user the suite runs as (root in CI) with ``socket_mode: 0660`` written
unquoted in its YAML file (YAML 1.1 reads it as the integer 432, which once became mode 0o432,
``r---wx-w-``: writable, so connectable, by every user) and ``socket_group`` set to a group the test
creates. Two users the test creates then connect from a forked child that drops to their uid, gid
and groups: one outside the group, one in it. ``connect(2)`` on a unix socket needs write
permission on it, so the outsider must get ``EACCES`` from the kernel, and the member must get the
server's HTTP/2 SETTINGS frame (gRPC answering). A control socket of mode 0666 in the same
directory shows the outsider can reach the directory, so the refusal is the agent socket's mode.
Users and group are removed afterwards. Creating users needs root: elsewhere the test skips.
"""
from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemons import AgentProcess
from tests.support.hazards import HazardOutcome

# What a forked client reports, as its exit status.
SERVED, REFUSED, CONNECTED_SILENT, OTHER_ERROR = 0, 1, 2, 3
# The client's HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113 §3.4, §6.5).
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS_FRAME_TYPE = 4


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def _users(prefix: str) -> Iterator[tuple[str, str, str]]:
    """A new group and two new users, ``(group, outsider, member)``; all removed on exit."""
    group, outsider, member = f"{prefix}g", f"{prefix}o", f"{prefix}m"
    made: list[tuple[str, str]] = []
    try:
        _run("groupadd", group)
        made.append(("groupdel", group))
        for name, extra in ((outsider, ()), (member, ("-G", group))):
            _run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", *extra, name)
            made.append(("userdel", name))
        yield group, outsider, member
    finally:
        for tool, name in reversed(made):
            subprocess.run([tool, name], capture_output=True, timeout=30)


def connect_as(user: str, path: Path) -> int:
    """Connect to the unix socket ``path`` as ``user`` (its uid, gid and groups) from a forked child."""
    entry = pwd.getpwnam(user)
    groups = os.getgrouplist(user, entry.pw_gid)
    pid = os.fork()
    if pid == 0:  # the child makes only system calls, then leaves without running Python's shutdown
        status = OTHER_ERROR
        try:
            os.setgroups(groups)
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5.0)
                try:
                    sock.connect(str(path))
                except PermissionError:
                    status = REFUSED
                else:
                    status = CONNECTED_SILENT
                    sock.sendall(PREFACE)
                    head = sock.recv(9)
                    status = SERVED if len(head) == 9 and head[3] == SETTINGS_FRAME_TYPE else status
        except OSError as exc:  # a reset after connecting leaves CONNECTED_SILENT
            status = REFUSED if exc.errno == errno.EACCES else status
        finally:
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status)


@contextlib.contextmanager
def _open_socket(path: Path) -> Iterator[None]:
    """A socket of mode 0666 at ``path`` that accepts and closes every connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        path.chmod(0o666)
        server.listen()
        stop = threading.Event()

        def serve() -> None:
            server.settimeout(0.2)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    server.accept()[0].close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"),
                    reason="creating users takes root and useradd (CI runs the suite as root)")
@pytest.mark.hazard(item=2, input="socket_mode: 0660 unquoted in the agent's YAML, socket_group set; a user outside "
                    "the group connects", promise="only the owner and socket_group can connect: the kernel refuses "
                    "every other local user")
def test_only_the_socket_group_can_connect(hazard: HazardOutcome) -> None:
    # Not under pytest's tmp_path (0700 root): other users must reach the directory for the test to mean anything.
    workdir = Path(tempfile.mkdtemp(prefix="chopper-socket-user-"))
    workdir.chmod(0o755)
    try:
        with _users(f"chs{os.getpid() % 100000}") as (group, outsider, member):
            config = workdir / "agent.yaml"
            config.write_text(f"socket_mode: 0660\nsocket_group: {group}\n")
            agent = AgentProcess(workdir, "--config", str(config)).start()
            try:
                st = os.stat(agent.socket)
                mode, owner_group = stat.S_IMODE(st.st_mode), grp.getgrgid(st.st_gid).gr_name
                outsider_tries = [connect_as(outsider, agent.socket) for _ in range(3)]
                member_tries = [connect_as(member, agent.socket) for _ in range(3)]
                with _open_socket(workdir / "control.sock"):
                    control = connect_as(outsider, workdir / "control.sock")
                assert agent.proc is not None and agent.proc.poll() is None, agent.log()
            finally:
                code = agent.terminate()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert (oct(mode), owner_group) == (oct(0o660), group)
    assert outsider_tries == [REFUSED] * 3, f"the outsider was not refused: {outsider_tries}"
    assert member_tries == [SERVED] * 3, f"the group member was not served: {member_tries}"
    assert control == CONNECTED_SILENT, "the outsider cannot reach the directory: the test shows nothing"
    assert code == 0
    hazard.outcome = (f"socket mode {mode:04o} group {group}; user outside the group refused by the kernel (EACCES) "
                      f"3 of 3 tries; group member got gRPC's HTTP/2 SETTINGS 3 of 3; the same outsider reached a "
                      f"0666 socket in the same directory; agent exited {code}")
