"""Trust of the token file, at start and on every reload, against a real agent and a real second user."""
from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chopper.daemon.auth import (
    MAX_TOKEN_FILE_BYTES,
    REFUSAL_REASONS,
    TokenError,
    TokenFile,
    UntrustedFile,
    read_client_token,
)
from chopper.demo.run import metric_sum
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import agent_pb2_grpc
from tests.support.daemons import AgentProcess
from tests.support.hazards import HazardOutcome
from tests.support.pki import write_token
from tests.support.polling import wait_until

CAPTURE = pb.CaptureRequest(job="nobody", steps=1, out_dir="/tmp/chopper-test-capture")
OPERATOR, INTRUDER = "operator-token", "intruder-token"

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="creating a second user needs root and useradd (CI runs as root)")


@contextlib.contextmanager
def other_user() -> Iterator[str]:
    """A fresh local user for the test, removed afterwards."""
    name = f"chop{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@contextlib.contextmanager
def shared_dir() -> Iterator[Path]:
    """A directory other users may pass through (mode 0711) but not list or write: where /etc/chopper would be."""
    path = Path(tempfile.mkdtemp(prefix="chopper-token-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def code_for(stub: agent_pb2_grpc.AgentStub, token: str) -> grpc.StatusCode:
    """How the agent answers RequestCapture with ``token``: NOT_FOUND means the token passed (no such job)."""
    try:
        stub.RequestCapture(CAPTURE, timeout=10, metadata=(("authorization", f"Bearer {token}"),))
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def scraped(agent: AgentProcess) -> dict[str, float]:
    """The agent's token-file reload counts from its /metrics: refused by reason, and ``reloads``."""
    text = agent.metrics()
    counts = {reason: metric_sum(text, "chopper_agent_token_file_reloads_refused_total", reason=reason)
              for reason in REFUSAL_REASONS}
    return {**counts, "reloads": metric_sum(text, "chopper_agent_token_file_reloads_total")}


@needs_root
@pytest.mark.hazard(item=4, input="chmod 666 on the token file at run time; another user appends a token",
                    promise="every reload checks the file; a file others can write is refused, the last good "
                            "tokens stay in force, the refusal is counted and logged")
def test_a_token_appended_by_another_user_after_a_chmod_is_never_accepted(tmp_path: Path, hazard) -> None:
    with other_user() as intruder, shared_dir() as etc:
        token_file = etc / "agent.token"
        write_token(token_file, OPERATOR)
        agent = AgentProcess(tmp_path, "--token-file", str(token_file)).start()
        try:
            with grpc.insecure_channel(agent.target) as channel:
                stub = agent_pb2_grpc.AgentStub(channel)
                assert code_for(stub, OPERATOR) == grpc.StatusCode.NOT_FOUND

                token_file.chmod(0o666)  # the clumsy operator
                appended = subprocess.run(["sh", "-c", f"echo {INTRUDER} >> {token_file}"],
                                          user=pwd.getpwnam(intruder).pw_uid, capture_output=True, text=True)
                assert appended.returncode == 0, appended.stderr  # the intruder did write the file
                assert INTRUDER in token_file.read_text()
                after_chmod = (code_for(stub, INTRUDER), code_for(stub, OPERATOR))
                assert after_chmod == (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.NOT_FOUND)

                # Fixing the mode does not launder what was written meanwhile: the same inode stays refused.
                token_file.chmod(0o600)
                after_fix = (code_for(stub, INTRUDER), code_for(stub, OPERATOR))
                assert after_fix == (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.NOT_FOUND)

                # A new file moved over the path by its owner is trusted and reloaded.
                fresh = etc / "agent.token.new"
                write_token(fresh, OPERATOR, "operator-two")
                fresh.rename(token_file)
                after_mv = code_for(stub, "operator-two")
                assert after_mv == grpc.StatusCode.NOT_FOUND
                counted = scraped(agent)
        finally:
            agent.terminate()
        log = agent.log()
        unsafe = log.count("event=token_file_refused reason=unsafe")
        tainted = log.count("event=token_file_refused reason=tainted")
        assert unsafe >= 1 and tainted >= 1, log[-3000:]
        assert counted == {"unsafe": unsafe, "tainted": tainted, "unusable": 0, "reloads": 1}, counted
        assert "is writable by every user (mode 0666)" in log and "mv it over" in log
        assert log.count("event=token_file_reloaded") == 1
        hazard.outcome = (f"intruder's token refused (UNAUTHENTICATED) after chmod 666 and after chmod 600 back; "
                          f"operator's token accepted throughout; {unsafe} reload(s) refused as unsafe and "
                          f"{tainted} as tainted, logged; a new file mv'd over the path reloaded (1 reload)")


@needs_root
@pytest.mark.hazard(item=4, input="token_file group/world-writable or owned by another user at start",
                    promise="a start-up error naming the file, the problem and the fix")
def test_the_agent_refuses_to_start_with_a_token_file_others_can_write(tmp_path: Path, hazard) -> None:
    with other_user() as intruder, shared_dir() as etc:
        outcomes = []
        for label, mode, owner in (("0620", 0o620, 0), ("0602", 0o602, 0), ("owned by another user", 0o600, intruder)):
            token_file = etc / "agent.token"
            write_token(token_file, OPERATOR)
            token_file.chmod(mode)
            if owner:
                shutil.chown(token_file, user=owner)
            proc = subprocess.run([*AgentProcess(tmp_path).argv(), "--token-file", str(token_file)],
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 2, proc.stderr[-2000:]
            assert str(token_file) in proc.stderr and "chmod 0640" in proc.stderr, proc.stderr[-2000:]
            outcomes.append(f"{label}: exit {proc.returncode}")
            token_file.unlink()
        hazard.outcome = "agent exits 2 naming the file and the chmod/chown fix: " + "; ".join(outcomes)


def test_trust_follows_symlinks_to_the_file_that_is_read(tmp_path: Path) -> None:
    # A Kubernetes Secret is a symlink to a root-owned file: trusted. A link to a file others can write is not.
    target = tmp_path / "secret"
    write_token(target, OPERATOR)
    link = tmp_path / "token"
    link.symlink_to(target)
    tokens = TokenFile(str(link))
    assert tokens.accepts(OPERATOR.encode())
    target.chmod(0o646)
    with pytest.raises(UntrustedFile, match="writable by every user"):
        TokenFile(str(link))
    assert not tokens.accepts(b"anything") and tokens.refused["unsafe"] == 1
    assert tokens.accepts(OPERATOR.encode())  # the last good tokens answer meanwhile


def test_unusable_reloads_keep_the_tokens_and_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "token"
    write_token(path, OPERATOR)
    tokens = TokenFile(str(path))
    path.write_text("\n\n")  # emptied in place (a half-done edit)
    assert tokens.accepts(OPERATOR.encode()) and tokens.refused["unusable"] == 1
    path.write_bytes(b"x" * (MAX_TOKEN_FILE_BYTES + 1))
    assert tokens.accepts(OPERATOR.encode()) and tokens.refused["unusable"] == 2
    write_token(path, "rotated")
    assert tokens.accepts(b"rotated") and not tokens.accepts(OPERATOR.encode()) and tokens.reloads == 1


@pytest.mark.parametrize("make", ["fifo", "directory", "huge"])
def test_a_token_file_that_is_no_token_file_is_refused_at_once(tmp_path: Path, make: str) -> None:
    # A FIFO would hang the read forever; a huge file would be read into memory: both refused before reading.
    path = tmp_path / "token"
    if make == "fifo":
        os.mkfifo(path, 0o600)
    elif make == "directory":
        path.mkdir(mode=0o700)
    else:
        path.write_bytes(b"t" * (MAX_TOKEN_FILE_BYTES + 10))
        path.chmod(0o600)
    for read in (lambda: TokenFile(str(path)), lambda: read_client_token(str(path))):
        with pytest.raises(TokenError, match=str(path)):
            read()


@pytest.mark.hazard(item=4, input="token file made writable by every user, then chmod 600 again; SIGHUP after each",
                    promise="SIGHUP reports the running agent's own verdict on the file (refused while writable and "
                            "after the fix, until a new file is moved in), never a fresh read's")
def test_sighup_reports_what_the_running_agent_refuses(tmp_path: Path, hazard: HazardOutcome) -> None:
    token_file = tmp_path / "agent.token"
    write_token(token_file, OPERATOR)
    agent = AgentProcess(tmp_path, "--token-file", str(token_file)).start()
    assert agent.proc is not None
    proc = agent.proc

    def sighup(outcome: str) -> str:
        """Send SIGHUP; the log line it gives (``outcome``: reloaded or reload_failed)."""
        seen = agent.log().count("signal=SIGHUP")
        proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: agent.log().count("signal=SIGHUP") > seen), agent.log()[-2000:]
        line = agent.log().split("signal=SIGHUP")[seen + 1].splitlines()[0]
        assert agent.log().split("signal=SIGHUP")[seen].endswith(f"event={outcome} "), (outcome, line)
        return line

    try:
        token_file.chmod(0o666)
        writable = sighup("reload_failed")
        token_file.chmod(0o600)  # a fresh read would find this file fine; the agent knows better
        fixed = sighup("reload_failed")
        with grpc.insecure_channel(agent.target) as channel:
            still = code_for(agent_pb2_grpc.AgentStub(channel), OPERATOR)
        counted = scraped(agent)
        fresh = tmp_path / "agent.token.new"
        write_token(fresh, "operator-two")
        fresh.rename(token_file)
        moved = sighup("reloaded")
        reloads = scraped(agent)["reloads"]
    finally:
        agent.terminate()
    assert "is writable by every user (mode 0666)" in writable, writable
    assert "was writable by other users earlier" in fixed and "mv it over" in fixed, fixed
    assert still == grpc.StatusCode.NOT_FOUND  # the operator's token stayed in force throughout
    assert counted == {"unsafe": 1, "tainted": 1, "unusable": 0, "reloads": 0}, counted
    assert "token_file: the files on disk are in force" in moved and reloads == 1, moved
    hazard.outcome = (f"SIGHUP while 0666: reload_failed (unsafe); after chmod 600: reload_failed (tainted), where a "
                      f"fresh read said the file loads; operator token accepted throughout; counted unsafe="
                      f"{counted['unsafe']:g}, tainted={counted['tainted']:g}; a new file mv'd over the path: "
                      f"reloaded ({reloads:g} reload)")
