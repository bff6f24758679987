"""Both daemons' ``--help`` (``chopper.daemon.settings.Daemon.parser``): every setting with its default and variable."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from agent.config import AgentSettings
from agent.main import main as agent_main
from aggregator.config import AggregatorSettings
from aggregator.main import main as aggregator_main

DAEMONS: dict[str, tuple[Callable[[Sequence[str]], int], type, str, list[str]]] = {
    "agent": (agent_main, AgentSettings, "CHOPPER_AGENT_", [
        "sampling rate, 1-100 Hz [default: 10.0; env: CHOPPER_AGENT_SAMPLE_HZ]",
        "[default: 0660; env: CHOPPER_AGENT_SOCKET_MODE]",
        "[default: (hostname); env: CHOPPER_AGENT_NODE]",
        "(empty: none; port 0: a free port, logged) [default: empty; env: CHOPPER_AGENT_GRPC_LISTEN]",
        "[default: 127.0.0.1:9477; env: CHOPPER_AGENT_METRICS_LISTEN]",
    ]),
    "aggregator": (aggregator_main, AggregatorSettings, "CHOPPER_AGGREGATOR_", [
        "[default: 127.0.0.1:9480; env: CHOPPER_AGGREGATOR_LISTEN]",
        "[default: 30.0; env: CHOPPER_AGGREGATOR_STEP_TIMEOUT_S]",
        "(empty: no store, rows are not kept) [default: empty; env: CHOPPER_AGGREGATOR_STORE_DIR]",
        "YAML settings file, keys as the settings below [env: CHOPPER_AGGREGATOR_CONFIG]",
    ]),
}


@pytest.mark.parametrize("daemon", sorted(DAEMONS))
def test_help_shows_every_setting_with_its_default_and_variable(daemon: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    main, settings, prefix, lines = DAEMONS[daemon]
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines wherever the terminal ends
    for f in dataclasses.fields(settings):
        assert f"--{f.name.replace('_', '-')} VALUE" in text
        assert f"; env: {prefix}{f.name.upper()}]" in text
    for line in lines:
        assert line in text


@pytest.mark.parametrize("daemon", sorted(DAEMONS))
def test_unknown_flag_exits_2_without_raising(daemon: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert DAEMONS[daemon][0](["--no-such-flag"]) == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
