"""``python -m deploy.stack``: agent, aggregator, Prometheus (with the rules), Alertmanager and a demo job.

1. Check what is needed is here: the Debian packages prometheus and prometheus-alertmanager,
   the rule files, and free ports (the well-known ones unless ``--free-ports``).
2. Write ``prometheus.yml`` and ``alertmanager.yml`` into the work directory and let ``promtool``
   check them (rule files included) when it is installed.
3. Start the aggregator (Parquet store in the work directory), the agent (``--backend auto``:
   real GPUs when present, else a simulated node) delivering to it, Prometheus scraping both
   and Alertmanager; wait until each answers over HTTP.
4. Start the demo training job (``chopper.demo.train``, CPU ranks over gloo) against the agent's
   socket, and print every URL.
5. Run until SIGINT (Ctrl-C) or SIGTERM, or until a daemon dies (exit 1, with its log); then stop
   everything in reverse order. The work directory keeps the logs, the store and the TSDB.
"""
from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from chopper import __version__
from chopper.daemon.stopsignals import StopSignals
from chopper.demo.run import free_port
from chopper.runs import consumer
from deploy.stack.config import alertmanager_yaml, prometheus_yaml
from deploy.stack.services import Service, StackError, wait_ready

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RULES = ROOT / "dashboards" / "rules" / "rules.yaml"
# The ports a real install uses (README); --free-ports picks unused ones instead.
PORTS = {"agent_metrics": 9477, "aggregator": 9480, "aggregator_metrics": 9481, "prometheus": 9090,
         "alertmanager": 9093}
BINARIES = {"prometheus": "prometheus", "alertmanager": "prometheus-alertmanager"}
READY_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 5.0
# A year: "until stopped" for the demo job, which takes a duration.
FOREVER_S = 365 * 86400


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deploy.stack", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--rules", type=Path, action="append",
                        help=f"Prometheus rule file, repeatable (default: {DEFAULT_RULES.relative_to(ROOT)}, if there)")
    parser.add_argument("--workdir", type=Path, help="logs, store and TSDB (default: a new temporary directory)")
    parser.add_argument("--free-ports", action="store_true", help="unused ports instead of 9477/9480/9481/9090/9093")
    parser.add_argument("--backend", default="auto", help="agent backend (default auto: GPUs if any, else simulated)")
    parser.add_argument("--ranks", type=int, default=2, help="CPU ranks of the demo training job (0: no job)")
    parser.add_argument("--train-seconds", type=float, default=0.0, help="demo job length, s (0: until stopped)")
    parser.add_argument("--scrape-interval", type=float, default=5.0, help="Prometheus scrape interval, s")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stack; 0 after a clean stop, 1 when a part failed, 2 when something it needs is missing."""
    args = parse_args(argv)
    try:
        plan = _plan(args)
    except StackError as exc:
        print(f"stack: {exc}", file=sys.stderr)
        return 2
    with StopSignals() as stop:
        return _run(plan, args, stop.event)


class Plan:
    """What the stack will run: addresses, paths and the daemons' services (not started)."""

    def __init__(self, args: argparse.Namespace, binaries: dict[str, str], rules: list[Path]) -> None:
        self.workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="chopper-stack-"))).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports = {k: free_port() for k in PORTS} if args.free_ports else dict(PORTS)
        self.addr = {k: f"127.0.0.1:{p}" for k, p in ports.items()}
        self.rules = rules
        self.socket = self.workdir / "agent.sock"
        self.target = f"unix://{self.socket}"
        w, a = self.workdir, self.addr
        py = sys.executable
        self.daemons = [
            Service("aggregator", [py, "-m", "aggregator.main", "--listen", a["aggregator"], "--metrics-listen",
                                   a["aggregator_metrics"], "--store-dir", str(w / "steps"),
                                   # One node: every rank reports within seconds, so the job-level
                                   # panels need not wait the production 30 s for stragglers.
                                   "--step-timeout-s", str(STEP_TIMEOUT_S)],
                    w / "aggregator.log", f"http://{a['aggregator_metrics']}/metrics"),
            Service("agent", [py, "-m", "agent", "--backend", args.backend, "--node", socket.gethostname(),
                              "--socket-path", str(self.socket), "--metrics-listen", a["agent_metrics"],
                              "--aggregators", a["aggregator"]],
                    w / "agent.log", f"http://{a['agent_metrics']}/metrics"),
            Service("prometheus", [binaries["prometheus"], f"--config.file={w / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={w / 'prometheus'}",
                                   f"--web.listen-address={a['prometheus']}",
                                   # Alerts evaluated before Alertmanager is discovered are dropped and
                                   # resent only after this delay (default 1m): keep a fresh stack prompt.
                                   "--rules.alert.resend-delay=5s"],
                    w / "prometheus.log", f"http://{a['prometheus']}/-/ready"),
            # --cluster.listen-address= turns off the gossip port (9094 on every interface).
            Service("alertmanager", [binaries["alertmanager"], f"--config.file={w / 'alertmanager.yml'}",
                                     f"--storage.path={w / 'alertmanager'}",
                                     f"--web.listen-address={a['alertmanager']}", "--cluster.listen-address="],
                    w / "alertmanager.log", f"http://{a['alertmanager']}/-/ready"),
        ]
        self.training: Service | None = None
        if args.ranks > 0:
            seconds = args.train_seconds or FOREVER_S
            self.training = Service(
                "training", [py, "-m", "chopper.demo.train", "--agent", self.target, "--ranks", str(args.ranks),
                             "--duration", f"{seconds:g}", "--port", str(free_port()), "--job", "demo"],
                w / "training.log", env={"PYTHONUNBUFFERED": "1"})


def _plan(args: argparse.Namespace) -> Plan:
    """Steps 1-2 of the module docstring; raises StackError naming what is missing."""
    binaries = {}
    for name, binary in BINARIES.items():
        path = shutil.which(binary)
        if path is None:
            raise StackError(f"{binary} is not installed; `apt-get install {binary}` (make stack does)")
        binaries[name] = path
    rules = [p.resolve() for p in (args.rules or ([DEFAULT_RULES] if DEFAULT_RULES.exists() else []))]
    for path in rules:
        if not path.is_file():
            raise StackError(f"--rules {path}: no such file; give a Prometheus rule file "
                             f"(`python -m dashboards` renders {DEFAULT_RULES.relative_to(ROOT)})")
    if args.ranks < 0 or args.train_seconds < 0 or args.scrape_interval <= 0:
        raise StackError("--ranks and --train-seconds must be >= 0 and --scrape-interval > 0")
    plan = Plan(args, binaries, rules)
    if not args.free_ports:
        for name, addr in plan.addr.items():
            if not _port_free(addr):
                raise StackError(f"{name}: {addr} is in use; stop what listens there or pass --free-ports")
    a = plan.addr
    (plan.workdir / "prometheus.yml").write_text(
        prometheus_yaml(a["agent_metrics"], a["aggregator_metrics"], a["alertmanager"], rules, args.scrape_interval))
    (plan.workdir / "alertmanager.yml").write_text(alertmanager_yaml())
    promtool = shutil.which("promtool")
    if promtool is not None:
        check = subprocess.run([promtool, "check", "config", str(plan.workdir / "prometheus.yml")],
                               capture_output=True, text=True, timeout=60, check=False)
        if check.returncode != 0:
            raise StackError(f"promtool rejects the configuration or a rule file:\n{check.stdout}{check.stderr}")
    return plan


def _port_free(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    with socket.socket() as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return True


def _run(plan: Plan, args: argparse.Namespace, stop: threading.Event) -> int:
    """Steps 3-5 of the module docstring."""
    started: list[Service] = []
    code = 0
    try:
        for service in plan.daemons:
            service.start()
            started.append(service)
        wait_ready(plan.daemons, READY_TIMEOUT_S)
        info = consumer.wait_for_info(plan.target, timeout_s=READY_TIMEOUT_S)
        if plan.training is not None:
            plan.training.start()
            started.append(plan.training)
        _print_urls(plan, info.backend, len(info.devices))
        code = _watch(plan, stop)
    except (StackError, consumer.AgentUnreachable) as exc:
        print(f"stack: {exc}", file=sys.stderr)
        code = 1
    finally:
        print("stack: stopping", flush=True)
        for service in reversed(started):
            print(f"stack: {service.name}: {service.stop()}", flush=True)
        print(f"stack: stopped; logs, store and TSDB are in {plan.workdir}", flush=True)
    return code


def _watch(plan: Plan, stop: threading.Event) -> int:
    """Wait for a stop signal; 1 if a daemon dies first. A finished or failed training job is reported only."""
    reported = False
    while not stop.wait(0.5):
        for service in plan.daemons:
            if (code := service.exit_code()) is not None:
                print(f"stack: {service.name} exited with {code}; its log ends:\n{service.log_tail()}",
                      file=sys.stderr)
                return 1
        training = plan.training
        if training is not None and not reported and (code := training.exit_code()) is not None:
            print(f"stack: the demo training job exited with {code} (log: {training.log}); the rest keeps running",
                  flush=True)
            reported = True
    return 0


def _print_urls(plan: Plan, backend: str, gpus: int) -> None:
    a = plan.addr
    rules = ", ".join(str(p) for p in plan.rules) or "none"
    training = (f"job=demo, {plan.training.argv[plan.training.argv.index('--ranks') + 1]} CPU ranks"
                if plan.training is not None else "none (--ranks 0)")
    print(f"""chopper stack is up (work directory {plan.workdir}):
  agent         http://{a['agent_metrics']}/metrics  backend={backend} gpus={gpus}
                trainers: CHOPPER_AGENT={plan.target}
  aggregator    http://{a['aggregator_metrics']}/metrics  gRPC {a['aggregator']}  store {plan.workdir / 'steps'}
  prometheus    http://{a['prometheus']}  rules: {rules}
  alertmanager  http://{a['alertmanager']}
  training      {training}
Ctrl-C stops everything.""", flush=True)
