"""``chopper-aggregator`` as a process: serves, and on SIGTERM finalizes open steps, writes the store, exits 0.

Also listeners on port 0: the ports bound are logged, and served.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pandas as pd

from chopper.demo.run import free_port, scrape
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.proto.chopper.v1 import aggregator_pb2_grpc
from tests.support.log_lines import daemon_log
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
    with daemon_log([sys.executable, "-m", "aggregator", "--listen", "127.0.0.1:0",
                     "--metrics-listen", "127.0.0.1:0"]) as log:
        listen, metrics = log.bound("listen"), log.bound("metrics_listen")
        assert listen.startswith("127.0.0.1:") and metrics.startswith("127.0.0.1:") and listen != metrics
        assert "chopper_aggregator_summaries_received_total 0.0" in scrape(f"http://{metrics}/metrics")
        with grpc.insecure_channel(listen) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
        port = listen.rpartition(":")[2]
        log.wait_for(rf"event=started grpc=127\.0\.0\.1:0 port={port} metrics=http://{metrics}/metrics ")
