"""A real Prometheus and Alertmanager (Debian packages) on loopback, and instant queries to Prometheus."""
from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from chopper.demo.run import free_port
from tests.support.polling import wait_until


class ServerProcess:
    """A Debian-packaged server (Prometheus, Alertmanager) on loopback, ready once ``/-/ready`` answers 200."""

    def __init__(self, workdir: Path, binary: str, address: str, *args: str) -> None:
        path = shutil.which(binary)
        if path is None:
            pytest.fail(f"{binary} is not installed; `make test` installs its Debian package (Makefile APT_PACKAGES)")
        self.workdir, self.name, self.address = workdir, binary, address
        self.argv = [path, *args]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30) -> ServerProcess:
        log = open(self.workdir / f"{self.name}.log", "wb")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        assert wait_until(self._ready, timeout_s=timeout_s), f"{self.name} did not start:\n{self.log()[-3000:]}"
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)

    def log(self) -> str:
        return (self.workdir / f"{self.name}.log").read_text()


def prometheus_process(workdir: Path, targets: dict[str, list[str]], rule_files: tuple[Path, ...] = (),
                       alertmanager: str = "") -> ServerProcess:
    """A real Prometheus scraping ``{scrape job: [host:port]}`` every second, evaluating rules every second.

    A plain scrape config, as production uses (``deploy/prometheus/prometheus.yml``): Chopper's series name
    the training job in ``training_job``, so nothing needs ``honor_labels``.
    """
    address = f"127.0.0.1:{free_port()}"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": hosts}]}
                           for job, hosts in targets.items()],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    return ServerProcess(workdir, "prometheus", address, f"--config.file={workdir / 'prometheus.yml'}",
                         f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address={address}")


def alertmanager_process(workdir: Path, webhook_url: str) -> ServerProcess:
    """A real Alertmanager sending every alert (and its resolution) to ``webhook_url`` within a second."""
    address = f"127.0.0.1:{free_port()}"
    config = {
        "route": {"receiver": "hook", "group_by": ["..."], "group_wait": "1s", "group_interval": "1s",
                  "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }
    (workdir / "alertmanager.yml").write_text(json.dumps(config))
    # No cluster listener: it would bind 9094 on every interface.
    return ServerProcess(workdir, "prometheus-alertmanager", address,
                         f"--config.file={workdir / 'alertmanager.yml'}", f"--storage.path={workdir / 'am-data'}",
                         f"--web.listen-address={address}", "--cluster.listen-address=")


def prom_query(prom: str, expr: str) -> list[dict]:
    """Instant query; [] while Prometheus is unreachable or the expression has no result."""
    url = f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return list(json.load(response)["data"]["result"])
    except OSError:
        return []
