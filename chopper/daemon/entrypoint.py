"""A daemon's ``main(argv) -> int``: settings, logging and stop signals, then the daemon's own serving."""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from chopper.daemon import logs
from chopper.daemon.malloc import cap_arenas
from chopper.daemon.settings import ConfigError
from chopper.daemon.stopsignals import StopSignals


class _Logged(Protocol):
    @property
    def log_level(self) -> str: ...


S = TypeVar("S", bound=_Logged)


def run_daemon(prog: str, argv: Sequence[str] | None, load: Callable[[Sequence[str] | None], S],
               recheck: Callable[[S], str], serve: Callable[[S, StopSignals], int]) -> int:
    """Load the settings from ``argv``, set up logging and stop signals, and ``serve`` until stopped.

    Args:
        prog: Program name for messages, e.g. ``chopper-agent``.
        argv: Command-line arguments (without the program name); None: ``sys.argv[1:]``.
        load: Settings from ``argv`` (and the environment); raises ``ConfigError``.
        recheck: What SIGHUP does before serving starts: check the files the daemon will take up,
            returning a line for the log, or raise ``ConfigError`` naming a bad one.
        serve: Runs the daemon until ``StopSignals`` says stop; returns the exit status.

    Returns:
        ``serve``'s status; 2 for a bad setting or flag; 0 after ``--help`` or ``--version``.
    """
    try:
        settings = load(argv)
    except ConfigError as exc:
        print(f"{prog}: bad configuration: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # argparse ends --help, --version (0) and an unknown flag (2) this way
        return int(exc.code or 0)
    logs.configure(settings.log_level)
    cap_arenas()  # before serve() starts the threads (chopper.daemon.malloc)
    # Installed before anything serves, so that a stop during start-up is a clean stop once started;
    # restored on return, for callers that run main() in process.
    with StopSignals.for_daemon(reload=lambda: recheck(settings)) as stop:
        return serve(settings, stop)
