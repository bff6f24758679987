"""Which SIGTERM disposition ``chopper.init`` replaces, and what its handler passes the signal on to.

Each case runs in a fresh interpreter (a test must not change the pytest process's signals). The
flush and the exit status against a real agent are ``tests/e2e/test_client_hazards.py``'s.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.hazards import HazardOutcome

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s)


def test_init_replaces_only_the_default_and_gives_it_back() -> None:
    out = run_python("""
        import json, signal, threading
        import chopper
        AGENT = "unix:///nonexistent/agent.sock"
        def name(h):
            return h.__name__ if callable(h) else str(int(h))  # SIG_DFL 0, SIG_IGN 1
        seen = {}
        chopper.init(job="j", agent=AGENT)
        seen["default"] = name(signal.getsignal(signal.SIGTERM))
        chopper.init(job="j", agent=AGENT)  # again: still one handler, passing on to the default
        seen["again"] = name(signal.getsignal(signal.SIGTERM)), name(chopper._sigterm_previous)
        chopper.shutdown(0.1)
        seen["after_shutdown"] = name(signal.getsignal(signal.SIGTERM))
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGTERM, mine)
        chopper.init(job="j", agent=AGENT)
        seen["user_handler"] = name(signal.getsignal(signal.SIGTERM))
        chopper.shutdown(0.1)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        chopper.init(job="j", agent=AGENT)
        seen["ignored"] = name(signal.getsignal(signal.SIGTERM))
        chopper.shutdown(0.1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        errors = []
        def init_in_thread():
            try:
                chopper.init(job="j", agent=AGENT)
            except Exception as e:
                errors.append(repr(e))
        t = threading.Thread(target=init_in_thread)
        t.start(); t.join()
        seen["thread"] = name(signal.getsignal(signal.SIGTERM)), errors
        chopper.shutdown(0.1)
        chopper.init(job="j", agent=AGENT)
        signal.signal(signal.SIGTERM, mine)  # set after init: shutdown must leave it
        chopper.shutdown(0.1)
        seen["set_after_init"] = name(signal.getsignal(signal.SIGTERM))
        print(json.dumps(seen))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == {
        "default": "_on_sigterm",
        "again": ["_on_sigterm", "0"],
        "after_shutdown": "0",
        "user_handler": "mine",
        "ignored": "1",
        "thread": ["0", []],
        "set_after_init": "mine",
    }


@pytest.mark.slow  # imports torch
@pytest.mark.hazard(item=10, input="SIGTERM under torch's elastic handler (it raises SignalException in the main "
                                   "thread), markers still queued",
                    promise="the queue is flushed first, then torch's handler runs as it would have")
def test_sigterm_under_torchs_handler_flushes_then_chains(hazard: HazardOutcome) -> None:
    out = run_python("""
        import json, os, signal, tempfile
        from pathlib import Path
        from torch.distributed.elastic.multiprocessing.api import SignalException, _terminate_process_handler
        import chopper
        from tests.support.marker_recorder import Recorder, start_server
        signal.signal(signal.SIGTERM, _terminate_process_handler)
        d = tempfile.mkdtemp(prefix="chp", dir="/tmp")
        chopper.init(job="torch", agent=f"unix://{d}/agent.sock")
        for i in range(100):
            with chopper.step(i), chopper.phase("forward"):
                pass
        pending = chopper.stats()["pending"]  # all: the agent is not there yet
        rec = Recorder()
        server = start_server(Path(d) / "agent.sock", rec)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            chained = False
        except SignalException:
            chained = True
        s = chopper.stats()
        print(json.dumps({"chained": chained, "pending": pending, "received": len(rec.markers()),
                          "queued": s["queued"], "sent": s["sent"], "dropped": s["dropped"],
                          "handler": signal.getsignal(signal.SIGTERM) is _terminate_process_handler}))
        server.stop(None)
    """, timeout_s=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"chained": True, "pending": 400, "received": 400, "queued": 400, "sent": 400, "dropped": 0,
                      "handler": True}
    hazard.outcome = (f"{result['pending']} markers queued at SIGTERM, {result['received']} received, 0 dropped; "
                      "then torch's handler raised SignalException, and is the handler again")
