"""The agent's unix socket over its life: made ready and bound at start, served again if removed, removed at stop.

Trainers reach the agent on this socket; its file mode and group decide who may connect
(docs/SECURITY.md). In the order of the agent's life:

1. ``prepare_socket_path``: the path must fit a unix socket address and sit in a directory the
   agent's user can write; only a stale socket (nobody listens) is ever removed from it.
2. ``serve_socket``: the server starts with its unix listener under umask 0177 (owner only), and
   only then is the socket given ``socket_group`` and ``socket_mode`` (``share_socket``), so no
   other user can connect in between.
3. ``SocketKeeper``: a thread that serves the path again when something removed its file.
4. ``remove_socket``: at a clean stop, the socket (and only a socket) is removed.
"""
from __future__ import annotations

import contextlib
import grp
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from agent.config import AgentSettings, ConfigError
from chopper.daemon.serving import SecureServer

log = logging.getLogger(__name__)

# A live agent accepts at once; a hung one is not waited for longer than this at start.
PROBE_TIMEOUT_S = 2.0


class SocketInUse(RuntimeError):
    """Another live process already serves the unix socket path."""


class SocketPathError(ConfigError):
    """``socket_path`` cannot hold the agent's socket; the message names the path, the reason and the fix."""


# gRPC refuses a unix socket path of more than 107 bytes (sockaddr_un.sun_path holds 108 with its NUL).
# SocketKeeper binds a spare beside the path, at "<path>.spare-<n>" (chopper.daemon.serving), so the path
# keeps room for that suffix: n below a million.
UNIX_PATH_MAX_BYTES = 107
SPARE_SUFFIX_BYTES = len(".spare-999999")
MAX_SOCKET_PATH_BYTES = UNIX_PATH_MAX_BYTES - SPARE_SUFFIX_BYTES
_OTHER_PATH = "choose another socket_path (the default is /run/chopper/agent.sock)"


def prepare_socket_path(path: Path, kind: int = socket.SOCK_STREAM, max_bytes: int = MAX_SOCKET_PATH_BYTES) -> None:
    """Make ``path`` ready for the agent to bind its socket, or say why it cannot be.

    1. The path must fit a unix socket address (``max_bytes``: ``MAX_SOCKET_PATH_BYTES`` leaves room
       for the spare ``SocketKeeper`` binds beside it). ``kind`` is the socket type to be bound.
    2. Its directory is created if missing, and must be a directory the agent's user can create
       files in.
    3. What is at the path is looked at without following a symbolic link (``lstat``). Nothing:
       ready. A socket: the agent connects to it; only a refused connection (nobody listens: a
       dead agent's leftover) lets it remove the file, and only if the path still names that same
       socket. A listening socket is another live agent's. Anything else (a regular file, a
       directory, a link, a FIFO or device) is never touched: start-up fails naming what is there.

    Raises:
        SocketPathError: The path is too long, its directory is unusable, or something other than
            a stale socket is there.
        SocketInUse: A live process serves the socket.
    """
    size = len(os.fsencode(path))
    if size > max_bytes:
        raise SocketPathError(
            f"socket_path: {str(path)[:60]!r}... is {size} bytes; a unix socket path holds at most "
            f"{max_bytes} here ({UNIX_PATH_MAX_BYTES} bytes less room for the spare the agent binds beside "
            f"it); {_OTHER_PATH}, or a shorter directory")
    _prepare_directory(path.parent)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SocketPathError(f"socket_path: cannot look at {path} ({exc.strerror}); {_OTHER_PATH}") from None
    if not stat.S_ISSOCK(st.st_mode):
        what, fix = _describe(path, st)
        raise SocketPathError(f"socket_path: {path} is {what}, not a socket; the agent replaces only a stale socket "
                              f"and has left it untouched. {fix}")
    if _listening(path, kind):
        raise SocketInUse(f"socket_path: {path} is served by another running agent; stop it or choose another path")
    try:
        current = os.lstat(path)
        if (current.st_dev, current.st_ino) == (st.st_dev, st.st_ino):  # still the socket that refused
            os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SocketPathError(f"socket_path: {path} is a stale socket (nobody listens) that the agent cannot remove "
                              f"({exc.strerror}); remove it as its owner, or {_OTHER_PATH}") from None


def _prepare_directory(directory: Path) -> None:
    """Create the socket's directory if missing; it must be a directory the agent's user can write."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise SocketPathError(
            f"socket_path: its directory {directory} cannot be made: a file that is not a directory is in the way on "
            f"that path; {_OTHER_PATH}") from None
    except OSError as exc:
        raise SocketPathError(
            f"socket_path: cannot create its directory {directory} ({exc.strerror}); create it writable by the "
            f"agent's user (deploy/systemd does with RuntimeDirectory=chopper), or {_OTHER_PATH}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SocketPathError(
            f"socket_path: the agent's user (uid {os.getuid()}) cannot create its socket in {directory}; make that "
            f"directory writable by the user (or its group), or {_OTHER_PATH}")


def _describe(path: Path, st: os.stat_result) -> tuple[str, str]:
    """What a non-socket file at ``path`` is ('a regular file of 5 bytes'), and the fix to offer."""
    mode = st.st_mode
    fix = f"Move it away yourself if it is not needed, or {_OTHER_PATH}"
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {os.readlink(path)!r} (links are not followed)", fix
        except OSError:
            return "a symbolic link (links are not followed)", fix
    if stat.S_ISDIR(mode):
        return "a directory", f"Name the socket file inside it (e.g. {path / 'agent.sock'}), or {_OTHER_PATH}"
    if stat.S_ISREG(mode):
        return f"a regular file of {st.st_size} bytes", fix
    if stat.S_ISFIFO(mode):
        return "a FIFO", fix
    return ("a device file" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else f"a file of mode {mode:o}"), fix


def _listening(path: Path, kind: int) -> bool:
    """Whether a process accepts connections of ``kind`` (a socket type) on the unix socket ``path``.

    Only a refused connection means nobody listens. Any other failure (a full backlog, a socket
    this user may not connect to) cannot tell, so it is not taken as stale.

    Raises:
        SocketPathError: The connection failed for another reason than a refusal.
    """
    probe = socket.socket(socket.AF_UNIX, kind)
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        return False
    except OSError as exc:
        raise SocketPathError(
            f"socket_path: {path} is a socket the agent cannot connect to ({exc.strerror or exc}), so it cannot tell "
            f"whether another process serves it; stop that process or remove the socket as its owner, or "
            f"{_OTHER_PATH}") from None
    finally:
        probe.close()
    return True


def serve_socket(server: SecureServer, sock: Path, settings: AgentSettings) -> None:
    """Start ``server`` with its unix listener on ``sock`` (ready per ``prepare_socket_path``), then share the socket.

    gRPC creates the socket file when the server starts, so the start happens under umask 0177.

    Raises:
        ConfigError: gRPC refused the bind (``SocketPathError``), or the socket cannot be given
            ``socket_group``; the server is stopped either way.
    """
    try:
        with owner_only():
            _listen_unix(server, sock)
            server.start()
        share_socket(sock, settings)
    except ConfigError:
        server.stop(0)
        raise


def _listen_unix(server: SecureServer, sock: Path) -> None:
    """Add the unix listener; a bind gRPC refuses after ``prepare_socket_path`` passed is named as ``socket_path``."""
    try:
        server.add_unix(str(sock))
    except RuntimeError as exc:
        raise SocketPathError(f"socket_path: cannot listen on {sock} ({exc}); {_OTHER_PATH}") from None


@contextlib.contextmanager
def owner_only() -> Iterator[None]:
    """umask 0177 for the block, so a socket is created reachable by its owner only."""
    saved = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(saved)


def share_socket(sock: Path, settings: AgentSettings) -> None:
    """Give the socket ``socket_group`` (when set) and ``socket_mode``.

    Raises:
        ConfigError: The group does not exist, or the agent's user is not in it.
    """
    if settings.socket_group:
        try:
            gid = grp.getgrnam(settings.socket_group).gr_gid
        except KeyError:
            raise ConfigError(
                f"socket_group: no group {settings.socket_group!r} on this node; create it or leave it empty"
            ) from None
        try:
            os.chown(sock, -1, gid)
        except PermissionError:
            raise ConfigError(
                f"socket_group: the agent's user is not in group {settings.socket_group!r}, so it cannot give it "
                "the socket; add the user to the group (no privilege is needed then)"
            ) from None
    os.chmod(sock, int(settings.socket_mode, 8))


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``, or None when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class SocketKeeper:
    """Serves the trainers' unix socket again after something removed it.

    ``rm -rf /run/chopper``, a tmpfiles cleanup or a second agent's cleanup leaves the agent
    listening on a socket no new trainer can reach (its file is gone; open streams are unaffected).
    Every ``period_s`` the keeper compares the path's (device, inode) with the socket it made; when
    they differ it recreates the directory, serves the path from a spare gRPC server
    (:meth:`chopper.daemon.serving.SecureServer.serve_unix_again`) with the same mode and group, and
    calls ``recreated`` (``Agent.socket_served_again``, which counts it for ``/metrics``). A path
    another live agent now serves is left to it (logged once).

    Args:
        server: The agent's gRPC server.
        settings: Give ``socket_path``, ``socket_group`` and ``socket_mode``.
        recreated: Called once each time the socket is served again.
        period_s: Seconds between checks.
    """

    def __init__(self, server: SecureServer, settings: AgentSettings, recreated: Callable[[], None],
                 period_s: float = 1.0) -> None:
        self.server = server
        self.settings = settings
        self.recreated = recreated
        self.path = Path(settings.socket_path)
        self.period_s = period_s
        self._ours = _identity(self.path)
        self._last_problem = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="socket-keeper", daemon=True)

    def start(self) -> SocketKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.check()

    def check(self) -> bool:
        """Recreate the socket if its file is no longer the one this agent made; True when it did."""
        if _identity(self.path) == self._ours:
            return False
        try:
            prepare_socket_path(self.path)
            with owner_only():
                self.server.serve_unix_again(str(self.path))
            share_socket(self.path, self.settings)
        except (OSError, RuntimeError, SocketInUse, ConfigError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if problem != self._last_problem:  # once per distinct problem, not once a second
                log.warning("event=socket_not_recreated path=%s error=%r", self.path, problem)
                self._last_problem = problem
            return False
        self._ours = _identity(self.path)
        self._last_problem = ""
        log.warning("event=socket_recreated path=%s note='its file had been removed; new trainers connect again'",
                    self.path)
        self.recreated()
        return True


def remove_socket(path: str) -> None:
    """Remove the socket at ``path`` on a clean stop; whatever else is there now (a file put in its place) stays."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):  # lstat: a link is not followed, so never its target
            os.unlink(path)
        else:
            log.warning("event=socket_path_replaced path=%s note='not a socket any more; left as it is'", path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("event=socket_not_removed path=%s error=%r", path, exc.strerror)
