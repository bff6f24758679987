"""Access checks on real gRPC servers in process: bearer token, rate limits, message size, socket mode, binds."""
from __future__ import annotations

import dataclasses
import grp
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import chopper
from agent.config import AgentSettings
from aggregator.config import AggregatorSettings
from chopper import cli
from chopper.daemon.access import Refusals
from chopper.daemon.serving import SecureServer
from chopper.daemon.settings import ConfigError
from chopper.daemon.tls import ClientTLS
from chopper.proto.chopper.v1 import agent_pb2 as pb
from tests.support.pki import Pki, write_token
from tests.support.polling import wait_until
from tests.support.running_servers import RunningAgent, ServedAggregator

CAPTURE = pb.CaptureRequest(job="nobody", steps=1, out_dir="/tmp/chopper-test-capture")


def refused(running: RunningAgent, rpc: str, reason: str) -> int:
    return running.agent.refusals.snapshot().get((rpc, reason), 0)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    """An in-process agent on a unix socket, with a 64 KiB message limit."""
    running = RunningAgent(tmp_path)
    yield running
    running.stop()


def test_request_capture_needs_a_token_of_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_file = tmp_path / "agent.token"
    write_token(token_file, "s3cret-one")
    running = RunningAgent(tmp_path, token_file=str(token_file))
    try:
        stub = running.stub
        with pytest.raises(grpc.RpcError) as err:
            stub.RequestCapture(CAPTURE, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and "--token-file" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.RequestCapture(CAPTURE, timeout=5, metadata=(("authorization", "Bearer s3cret-on"),))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and "not accepted" in err.value.details()
        # The right token passes the check: the agent answers the request itself (no such job).
        with pytest.raises(grpc.RpcError) as err:
            stub.RequestCapture(CAPTURE, timeout=5, metadata=(("authorization", "Bearer s3cret-one"),))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert stub.GetInfo(pb.GetInfoRequest(), timeout=5).node == "n1"  # reading needs no token
        assert (refused(running, "RequestCapture", "no_token"), refused(running, "RequestCapture", "wrong_token")) \
            == (1, 1)
        # Rotation: a second line is accepted at once, without a restart.
        write_token(token_file, "s3cret-one", "s3cret-two")
        with pytest.raises(grpc.RpcError) as err:
            stub.RequestCapture(CAPTURE, timeout=5, metadata=(("authorization", "bearer s3cret-two"),))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        # The CLI reads its token from a file; a wrong one is a refusal (exit 2) that says why.
        wrong = tmp_path / "wrong.token"
        write_token(wrong, "guess")
        code = cli.main(["capture", "--agent", running.target, "--job", "j", "--steps", "1",
                         "--out", str(tmp_path / "cap"), "--token-file", str(wrong)])
        assert code == 2 and "bearer token is not accepted" in capsys.readouterr().err
        assert refused(running, "RequestCapture", "wrong_token") == 2
        assert not (tmp_path / "cap").exists()
    finally:
        running.stop()


def test_a_client_over_its_rate_limit_is_refused_and_counted_while_others_are_served(pki: Pki) -> None:
    # One call per 100 s: a bucket holds one call (never less), and no token comes back during the burst however
    # slowly its mTLS handshakes go; the size of a burst and the refill are test_ratelimit's, on a fake clock.
    served = ServedAggregator(AggregatorSettings(tls_cert=pki.server.cert, tls_key=pki.server.key,
                                                 tls_client_ca=pki.ca, rate_limit_calls_per_s=0.01))
    try:
        greedy = ClientTLS(pki.ca, pki.client_a.cert, pki.client_a.key)
        codes = [served.query(greedy) for _ in range(6)]
        assert codes == [grpc.StatusCode.OK] + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 5, codes
        # Another client (its own certificate, so its own bucket) is served meanwhile.
        assert served.query(ClientTLS(pki.ca, pki.client_b.cert, pki.client_b.key)) == grpc.StatusCode.OK
        rpcs = served.core.refusals.snapshot()
        assert rpcs == {("QuerySteps", "rate_limited"): codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)}
        assert 'chopper_aggregator_rpc_refused_total{reason="rate_limited",rpc="QuerySteps"}' in served.scrape()
    finally:
        served.stop()


def test_a_flooding_trainer_is_cut_without_blocking_or_raising(tmp_path: Path) -> None:
    running = RunningAgent(tmp_path, rate_limit_messages_per_s="20")
    # One marker per batch and no batching delay: far more messages per second than the limit.
    client = chopper.Client("flood", 0, 0, running.target, max_batch=1, flush_interval_s=0.0, control=False)
    try:
        started = time.monotonic()
        step = 0
        while time.monotonic() - started < 1.5:
            with client.step(step):
                pass
            step += 1
            time.sleep(0.0005)
        assert wait_until(lambda: refused(running, "PushMarkers", "rate_limited") >= 1, timeout_s=10)
        # Other clients of the same socket are served meanwhile.
        assert running.stub.GetInfo(pb.GetInfoRequest(), timeout=5).node == "n1"
        client.shutdown(timeout=2.0)
        stats = client.stats()
        # The cut streams cost markers, each one counted on the client's side.
        assert stats["dropped_in_flight"] >= 1 and stats["sent"] < stats["queued"]
    finally:
        client.shutdown(timeout=0.5)
        running.stop()


def test_oversized_messages_are_refused_and_counted(agent: RunningAgent) -> None:
    running = agent
    limit = running.settings.max_message_bytes
    push_raw = running.channel.stream_unary("/chopper.v1.Agent/PushMarkers")
    info_raw = running.channel.unary_unary("/chopper.v1.Agent/GetInfo")
    for call in (lambda: push_raw(iter([b"\x00" * (limit + 1)]), timeout=5),
                 lambda: info_raw(b"\x00" * (limit + 1), timeout=5)):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_message_bytes" in err.value.details()
    assert refused(running, "PushMarkers", "too_large") == refused(running, "GetInfo", "too_large") == 1
    assert running.stub.GetInfo(pb.GetInfoRequest(), timeout=5).node == "n1"


def test_socket_mode_and_group(tmp_path: Path) -> None:
    # A group other than the process's own, so that the check can fail; root may give any.
    candidates = [g for g in (grp.getgrall() if os.geteuid() == 0 else map(grp.getgrgid, os.getgroups()))
                  if g.gr_gid != os.getegid()]
    group = candidates[0] if candidates else grp.getgrgid(os.getegid())
    running = RunningAgent(tmp_path, socket_group=group.gr_name)
    try:
        st = os.stat(running.settings.socket_path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == group.gr_gid
    finally:
        running.stop()
    with pytest.raises(ConfigError, match="socket_group: no group 'no-such-group-here'"):
        (tmp_path / "other").mkdir()
        RunningAgent(tmp_path / "other", socket_group="no-such-group-here")


def test_tcp_listeners_bind_loopback_unless_told_otherwise(caplog: pytest.LogCaptureFixture) -> None:
    for cls in (AgentSettings, AggregatorSettings):
        for f in dataclasses.fields(cls):
            if f.name.endswith("listen") and f.default:
                host = str(f.default).rpartition(":")[0]
                assert host in ("127.0.0.1", "[::1]"), (cls.__name__, f.name, f.default)
    assert AgentSettings().grpc_listen == ""  # no TCP at all by default
    server = SecureServer([], [], Refusals(), max_workers=2, max_message_bytes=1 << 16, max_send_bytes=1 << 16,
                          calls_per_s=0, messages_per_s=0)
    with caplog.at_level(logging.WARNING, logger="chopper.daemon.serving"):
        server.add_tcp("0.0.0.0:0", None)
    server.stop(0)
    assert "event=plaintext_listen listen=0.0.0.0:0" in caplog.text


@pytest.mark.parametrize(("argv", "message"), [
    (["--tls-cert", "{cert}", "--tls-key", "{key}"], "tls_cert: TLS applies to grpc_listen, which is empty"),
    (["--grpc-listen", "127.0.0.1:1", "--tls-cert", "{cert}"], "tls_cert and tls_key go together"),
    (["--grpc-listen", "127.0.0.1:1", "--tls-cert", "{missing}", "--tls-key", "{key}"],
     "tls_cert {missing}: cannot be read"),
    (["--grpc-listen", "127.0.0.1:1", "--tls-cert", "{token}", "--tls-key", "{key}"], "is not a PEM file"),
    (["--grpc-listen", "127.0.0.1:1", "--tls-cert", "{cert}", "--tls-key", "{other_key}"],
     "are not a certificate chain and its private key"),
    (["--token-file", "{empty}"], "token_file {empty}: holds no token"),
    (["--token-file", "{missing}"], "token_file {missing}: cannot be read"),
    (["--aggregator-tls-cert", "{cert}"], "aggregator_tls_cert and aggregator_tls_key go together"),
    (["--rate-limit-calls-per-s", "-1"], "rate_limit_calls_per_s: -1.0 is not a rate"),
])
def test_bad_access_settings_name_the_key(tmp_path: Path, pki: Pki, argv: list[str], message: str) -> None:
    from agent.config import load_settings

    (tmp_path / "empty").write_text("\n")
    paths = {"cert": pki.server.cert, "key": pki.server.key, "other_key": pki.client_a.key,
             "missing": str(tmp_path / "missing.pem"), "token": write_token(tmp_path / "t", "x"),
             "empty": str(tmp_path / "empty")}
    with pytest.raises(ConfigError) as err:
        load_settings(["--backend", "simulated", *(a.format(**paths) for a in argv)], env={})
    assert message.format(**paths) in str(err.value)


def test_clients_never_send_a_token_in_clear_text_over_the_network(pki: Pki) -> None:
    from chopper.runs.connect import ClientSecurity

    plain = ClientSecurity(token="t")
    for target in ("unix:///run/chopper/agent.sock", "127.0.0.1:9478", "localhost:9478", "[::1]:9478"):
        plain.check(target)
    with pytest.raises(ConfigError, match="refusing to send the token in clear text to node7:9478"):
        plain.check("node7:9478")
    ClientSecurity(ClientTLS(pki.ca), token="t").check("node7:9478")
    token = write_token(Path(pki.ca).parent / "cleartext.token", "t")
    assert cli.main(["info", "--agent", "node7:9478", "--token-file", token]) == 2


class _Streams:
    """A server on a unix socket with one server-streaming and one unary method, and bounded streams."""

    def __init__(self, path: Path, max_workers: int) -> None:
        self.refusals = Refusals()
        self.release = threading.Event()

        def ticks(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            yield b"open"
            while not self.release.wait(0.05) and context.is_active():
                pass

        handlers = grpc.method_handlers_generic_handler("t.T", {
            "Ticks": grpc.unary_stream_rpc_method_handler(ticks),
            "Ping": grpc.unary_unary_rpc_method_handler(lambda request, context: b"pong"),
        })
        self.server = SecureServer([handlers], ["t.T"], self.refusals, max_workers=max_workers,
                                   max_message_bytes=1 << 16, max_send_bytes=1 << 16, calls_per_s=0, messages_per_s=0)
        self.server.add_unix(str(path))
        self.server.start()
        self.channel = grpc.insecure_channel(f"unix:{path}")

    def open(self, pid: int) -> Any:
        call = self.channel.unary_stream("/t.T/Ticks")(b"", metadata=(("chopper-pid", str(pid)),))
        return call

    def ping(self) -> bytes:
        return bytes(self.channel.unary_unary("/t.T/Ping")(b"", timeout=5))

    def stop(self) -> None:
        self.release.set()
        self.channel.close()
        self.server.stop(0).wait(5)


def test_stream_slots_refuse_beyond_the_bound_keep_unary_calls_and_come_back_when_streams_end(tmp_path: Path) -> None:
    streams = _Streams(tmp_path / "s.sock", max_workers=8)
    try:
        # One local process may hold 6 of the 8 (STREAM_SHARE); a seventh of its own is refused.
        held = [streams.open(pid=1) for _ in range(6)]
        assert all(next(call) == b"open" for call in held)
        with pytest.raises(grpc.RpcError) as err:
            next(streams.open(pid=1))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "6 open streams" in err.value.details()
        # Another client takes the last two slots; beyond them the server is full for everyone.
        others = [streams.open(pid=2) for _ in range(2)]
        assert all(next(call) == b"open" for call in others)
        with pytest.raises(grpc.RpcError) as err:
            next(streams.open(pid=3))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert streams.ping() == b"pong"  # every stream slot held: the reserve still serves unary calls
        assert streams.refusals.snapshot() == {("Ticks", "streams_per_client"): 1, ("Ticks", "too_many_streams"): 1}
        # Streams the clients cancel give their slots back.
        for call in held + others:
            call.cancel()
        assert wait_until(lambda: streams.server.streams.open == 0, timeout_s=10), streams.server.streams.open
        again = [streams.open(pid=1) for _ in range(6)]
        assert all(next(call) == b"open" for call in again)
    finally:
        streams.stop()
