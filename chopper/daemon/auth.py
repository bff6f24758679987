"""Bearer tokens for the RPCs that make a daemon act (``RequestCapture``): read from files, never flags.

A token on a command line shows in ``ps`` and in shell history, so both sides take a *file*:
the server's ``token_file`` and the client's ``--token-file`` / ``CHOPPER_TOKEN_FILE``. The client
sends ``authorization: Bearer <token>`` metadata.

Server side, ``TokenFile`` accepts every non-empty line of its file, so a token is rotated
without a restart or a refused request: append the new token, move the clients to it, delete the
old line. A presented token is compared with every accepted token by ``hmac.compare_digest``, so
the time taken does not reveal how much of a guess was right.

Whoever can write the file can let themselves in, so the file is trusted only when nobody but
the daemon's user and root can write it (``trust_problem``; ``read_trusted`` reads any such file,
e.g. TLS keys and CA bundles). It is checked at start (a failure
is a start-up error) and on every reload. Algorithm, on each protected call (they are rare):

1. ``stat`` the path (symlinks followed: Kubernetes mounts Secrets as links). Unchanged inode,
   size, mtime and mode: the tokens in force answer.
2. Changed: open it (never blocking, so a FIFO cannot hang the call), ``fstat`` what was opened
   and check that: a regular file of at most ``MAX_TOKEN_FILE_BYTES``, owned by the daemon's
   user or root, not writable by group or others. Then read it; it must hold a token.
3. A refused reload keeps the last good tokens in force, is counted in ``TokenFile.refused`` by
   reason and logged (``event=token_file_refused``); ``TokenFile.check`` (SIGHUP) names the
   refusal in force.
4. Once an inode has been seen writable by others, its content is never trusted again, even
   after its mode is fixed: another user may have written to it meanwhile (``TrustedReader``,
   which the TLS files share). Its owner writes the tokens to a new file and moves it over the
   path (a new inode), and that is reloaded.

The check happens when a protected call comes; a file made writable and fixed again between two
calls is not seen (docs/SECURITY.md).
"""
from __future__ import annotations

import hmac
import logging
import os
import stat
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from chopper.daemon.settings import ConfigError

log = logging.getLogger(__name__)

HEADER = "authorization"
SCHEME = "bearer "
# A token file holds a few lines; more is not a token file, and is never read into memory.
MAX_TOKEN_FILE_BYTES = 64 * 1024
# Why a reload was refused: the keys of ``TokenFile.refused``.
REFUSAL_REASONS = {
    "unsafe": "the file (or the file a symlink points to) is writable by other users, owned by another user, or "
              "not a regular file",
    "tainted": "the file was writable by other users earlier; only a new file moved over the path is trusted",
    "unusable": "the file cannot be read, is not text, is too large or holds no token",
}


class Reloaded(Protocol):
    """A set of files a running daemon re-reads as they change (``TokenFile``, ``chopper.daemon.tls.PemFiles``)."""

    reloads: int
    refused: Counter[str]

    def check(self) -> None:
        """Take the files now if they changed; raise ``ConfigError`` naming why the files now there are refused."""


def recheck(files: Mapping[str, Reloaded]) -> str:
    """SIGHUP: every file set of a running daemon takes its files now; what is in force, for the log.

    Raises:
        ConfigError: One or more sets are refused (each named; what was in force before stays).
    """
    problems = []
    for found in files.values():
        try:
            found.check()
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("; ".join(problems))
    return f"{', '.join(files)}: the files on disk are in force" if files else "no token_file or TLS files are set"


class TokenError(ConfigError):
    """A token file cannot be used; the message names the file and the fix."""


class UntrustedFile(TokenError):
    """A security-relevant file that users other than the daemon's and root could have written.

    Attributes:
        st: The status of the file that was opened.
    """

    def __init__(self, message: str, st: os.stat_result) -> None:
        super().__init__(message)
        self.st = st


def trust_problem(st: os.stat_result, uid: int | None = None) -> str | None:
    """Why a file with status ``st`` cannot be trusted to hold secrets, or None when it can.

    Trusted: a regular file owned by ``uid`` (default: this process's effective user) or root,
    with neither the group nor the others write bit.
    """
    uid = os.geteuid() if uid is None else uid
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid not in (0, uid):
        return f"is owned by uid {st.st_uid}, not by the daemon's user (uid {uid}) or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "every user" if st.st_mode & stat.S_IWOTH else "its group"
        return f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _fix(path: Path) -> str:
    return f"chown root {path} && chmod 0640 {path} (or 0600), and keep its directory writable by its owner only"


def read_trusted(path: Path, what: str, *, max_bytes: int, trusted: bool = True) -> tuple[bytes, os.stat_result]:
    """The content of ``path`` and the status of what was read, for a file that holds secrets or trust.

    Opened without blocking (a FIFO cannot hang the caller), checked through the opened file (no
    race with a rename over the path), and read only when it is a regular file of at most
    ``max_bytes``; with ``trusted``, it must also pass ``trust_problem``.

    Raises:
        UntrustedFile: ``trusted`` and the file fails ``trust_problem``.
        TokenError: The file cannot be read, is not a regular file or is over ``max_bytes``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise TokenError(f"{what} {path}: cannot be read ({exc.strerror}); check the path and its "
                         "permissions") from None
    try:
        st = os.fstat(fd)  # what was opened, not what the path names a moment later
        problem = trust_problem(st) if trusted else (None if stat.S_ISREG(st.st_mode) else "is not a regular file")
        if problem is not None:
            raise UntrustedFile(f"{what} {path}: {problem}, so another user could put their own secret or trust "
                                f"in it; {_fix(path)}", st)
        if st.st_size > max_bytes:
            raise TokenError(f"{what} {path}: is {st.st_size} bytes, over {max_bytes}; check that it is the right file")
        data = b""
        while len(data) <= max_bytes and (chunk := os.read(fd, max_bytes + 1)):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise TokenError(f"{what} {path}: grew over {max_bytes} bytes while it was read")
    return data, st


class TaintedFile(TokenError):
    """A trusted file now, but the same inode was writable by other users earlier (module docstring, 4)."""


def refusal_reason(exc: Exception) -> str:
    """The ``REFUSAL_REASONS`` key of a refused read of a trusted file (anything but trust: ``unusable``)."""
    if isinstance(exc, UntrustedFile):
        return "unsafe"
    if isinstance(exc, TaintedFile):
        return "tainted"
    return "unusable"


class TrustedReader:
    """``read_trusted`` that remembers: an inode once seen writable by others is never trusted again.

    One per daemon's set of files (its token file, its TLS files), for the daemon's life.
    """

    def __init__(self) -> None:
        self._tainted: set[tuple[int, int]] = set()  # (device, inode) of files others could write

    def read(self, path: Path, what: str, *, max_bytes: int) -> tuple[bytes, os.stat_result]:
        """As ``read_trusted(path, what, max_bytes=max_bytes)``, and never from a tainted inode.

        Raises:
            UntrustedFile: The file fails ``trust_problem`` (a regular file is tainted from then on).
            TaintedFile: The file passes, but was seen writable by others before.
            TokenError: As ``read_trusted``.
        """
        try:
            data, st = read_trusted(path, what, max_bytes=max_bytes)
        except UntrustedFile as exc:
            if stat.S_ISREG(exc.st.st_mode):  # another user could write it: its content stays suspect
                self._tainted.add((exc.st.st_dev, exc.st.st_ino))
            raise
        if (st.st_dev, st.st_ino) in self._tainted:
            raise TaintedFile(f"{what} {path}: was writable by other users earlier, so it may hold what they wrote; "
                              f"write it anew to another file and mv it over {path}")
        return data, st


def _read_tokens(path: Path, what: str, *, trusted: bool,
                 reader: TrustedReader | None = None) -> tuple[tuple[bytes, ...], os.stat_result]:
    """The non-empty lines of ``path`` (``read_trusted``, or ``reader`` when given) and the status of what was read.

    Raises:
        TokenError: As ``read_trusted``/``TrustedReader.read``, or the file is not text or holds no token.
    """
    if reader is not None:
        data, st = reader.read(path, what, max_bytes=MAX_TOKEN_FILE_BYTES)
    else:
        data, st = read_trusted(path, what, max_bytes=MAX_TOKEN_FILE_BYTES, trusted=trusted)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise TokenError(f"{what} {path}: is not text; it must hold the token on a line of its own") from None
    tokens = tuple(line.strip().encode() for line in text.splitlines() if line.strip())
    if not tokens:
        raise TokenError(f"{what} {path}: holds no token; write the token on a line of its own")
    return tokens, st


def read_client_token(path: str) -> str:
    """The token a client presents: the first non-empty line of ``path``.

    Raises:
        TokenError: The file is unreadable, not a regular file, too large or empty.
    """
    return _read_tokens(Path(path), "--token-file", trusted=False)[0][0].decode()


def metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``token``."""
    return ((HEADER, f"Bearer {token}"),)


def presented(invocation_metadata: Sequence[tuple[str, str | bytes]] | None) -> bytes | None:
    """The bearer token of a call's metadata, or None when it carries none."""
    for key, value in invocation_metadata or ():
        if key == HEADER:
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            if text[: len(SCHEME)].lower() == SCHEME:
                return text[len(SCHEME):].strip().encode()
    return None


class TokenFile:
    """The tokens a server accepts, from ``path`` (one per line), re-read when the file changes.

    Attributes:
        reloads: Reloads that took effect.
        refused: Reloads refused, by reason (``REFUSAL_REASONS``); the last good tokens stayed.
        problem: Why the file now at ``path`` is refused, or None when its tokens are the ones in force.

    Args:
        path: The token file (the ``token_file`` setting).

    Raises:
        TokenError: The file is unreadable, holds no token or is not trusted (module docstring).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.reloads = 0
        self.refused: Counter[str] = Counter({reason: 0 for reason in REFUSAL_REASONS})
        self.problem: str | None = None
        self._reader = TrustedReader()
        self._tokens, st = _read_tokens(self.path, "token_file", trusted=True, reader=self._reader)
        self._signature = self._signature_of(st)
        if st.st_mode & stat.S_IROTH:
            log.warning("event=token_file_open path=%s note='every user of this host can read it; chmod 0640 and "
                        "give the group to the operators who run chopper capture'", self.path)

    @staticmethod
    def _signature_of(st: os.stat_result) -> tuple[int, int, int, int, int, int]:
        # Mode and owner too: a chmod or chown alone is a change to check.
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid)

    def _stat(self) -> os.stat_result | None:
        try:
            return os.stat(self.path)
        except OSError:
            return None

    def _refresh(self) -> tuple[bytes, ...]:
        st = self._stat()
        with self._lock:
            if st is None or self._signature_of(st) == self._signature:
                return self._tokens
            self._signature = self._signature_of(st)
            self._reload()
            return self._tokens

    def _reload(self) -> None:
        """Re-read the file (caller holds the lock): its tokens take effect, or the refusal is counted and logged."""
        try:
            tokens, _ = _read_tokens(self.path, "token_file", trusted=True, reader=self._reader)
        except TokenError as exc:
            reason = refusal_reason(exc)
            self.refused[reason] += 1
            self.problem = str(exc)
            log.warning("event=token_file_refused reason=%s error=%r note='the previous tokens stay in force'",
                        reason, self.problem)
            return
        self._tokens = tokens
        self.problem = None
        self.reloads += 1
        log.info("event=token_file_reloaded path=%s tokens=%d", self.path, len(tokens))

    def check(self) -> None:
        """Take the file now if it changed (as a protected call would), for SIGHUP.

        Raises:
            TokenError: The file at ``path`` is refused (``problem``); the previous tokens stay in force.
        """
        self._refresh()
        if self.problem is not None:
            raise TokenError(f"{self.problem} (the previous tokens stay in force)")

    def accepts(self, token: bytes) -> bool:
        """Whether ``token`` is one of the file's tokens (constant time in the token's content)."""
        matched = False
        for good in self._refresh():
            matched |= hmac.compare_digest(token, good)
        return matched
