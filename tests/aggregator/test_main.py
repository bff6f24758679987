"""``chopper-aggregator`` as a process: serves, and on SIGTERM finalizes open steps, writes the store, exits 0.

Also as a user runs it: ``--help`` shows the defaults, ``--version``, listeners on port 0.
"""
from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pandas as pd
import pytest

from aggregator.config import AggregatorSettings
from aggregator.main import main
from chopper import __version__
from chopper.demo.run import free_port, scrape
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.proto.chopper.v1 import aggregator_pb2_grpc
from tests.support.log_lines import LogLines
from tests.support.summaries import summary


def test_sigterm_flushes_open_steps_to_the_store(tmp_path: Path) -> None:
    listen, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    store = tmp_path / "steps"
    proc = subprocess.Popen([sys.executable, "-m", "aggregator.main", "--listen", listen, "--metrics-listen", metrics,
                             "--store-dir", str(store)], stderr=subprocess.PIPE, text=True)
    try:
        channel = grpc.insecure_channel(listen)
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = aggregator_pb2_grpc.AggregatorStub(channel)
        b = apb.SummaryBatch(agent="n0", incarnation="i0", seq=[1, 2, 3])
        b.summaries.extend([summary("j", 0, 0), summary("j", 1, 0), summary("j", 0, 1)])
        assert [a.acked_seq for a in stub.Deliver(iter([b]))] == [3]
        channel.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert "chopper_aggregator_summaries_received_total 3.0" in text
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "event=stopped rows_written=3" in err
    rows = pd.read_parquet(store)
    # Still in the join period at shutdown: both steps written, step 1 as incomplete.
    assert sorted(zip(rows["step"], rows["rank"], rows["complete"], strict=True)) == [
        (0, 0, True), (0, 1, True), (1, 0, False)]


def test_port_0_listeners_log_the_ports_they_bound_and_serve_there() -> None:
    # Both at 127.0.0.1:0: not "the same address", since each takes a free port of its own.
    proc = subprocess.Popen([sys.executable, "-m", "aggregator", "--listen", "127.0.0.1:0",
                             "--metrics-listen", "127.0.0.1:0"], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    log = LogLines(proc.stderr)
    try:
        grpc_addr = log.wait_for(r"event=listening listen=(127\.0\.0\.1:(\d+))$")
        metrics = log.wait_for(r"event=listening metrics_listen=(127\.0\.0\.1:(\d+))$")
        assert 0 not in (int(metrics[2]), int(grpc_addr[2])) and metrics[2] != grpc_addr[2]
        assert "chopper_aggregator_summaries_received_total 0.0" in scrape(f"http://{metrics[1]}/metrics")
        with grpc.insecure_channel(grpc_addr[1]) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
        log.wait_for(rf"event=started grpc=127\.0\.0\.1:0 port={grpc_addr[2]} metrics=http://{metrics[1]}/metrics ")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.text()


def test_help_shows_every_setting_with_its_default_and_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines wherever the terminal ends
    for f in dataclasses.fields(AggregatorSettings):
        assert f"--{f.name.replace('_', '-')} VALUE" in text
        assert f"; env: CHOPPER_AGGREGATOR_{f.name.upper()}]" in text
    assert "[default: 127.0.0.1:9480; env: CHOPPER_AGGREGATOR_LISTEN]" in text
    assert "[default: 30.0; env: CHOPPER_AGGREGATOR_STEP_TIMEOUT_S]" in text
    assert "(empty: no store, rows are not kept) [default: empty; env: CHOPPER_AGGREGATOR_STORE_DIR]" in text
    assert "YAML settings file, keys as the settings below [env: CHOPPER_AGGREGATOR_CONFIG]" in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"chopper-aggregator {__version__}\n"
