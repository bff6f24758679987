"""Bearer tokens for the RPCs that make a daemon act (``RequestCapture``): read from files, never flags.

A token on a command line shows in ``ps`` and in shell history, so both sides take a *file*:
the server's ``token_file`` and the client's ``--token-file`` / ``CHOPPER_TOKEN_FILE``. The client
sends ``authorization: Bearer <token>`` metadata.

Server side, ``TokenFile`` accepts every non-empty line of its file, so a token is rotated
without a restart or a refused request: append the new token, move the clients to it, delete the
old line. The file is re-read when its size, inode or modification time changes (checked on each
protected call, which are rare); if it becomes unreadable or empty the last good tokens stay in
force and a warning is logged. A presented token is compared with every accepted token by
``hmac.compare_digest``, so the time taken does not reveal how much of a guess was right.
"""
from __future__ import annotations

import hmac
import logging
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from chopper.settings import ConfigError

log = logging.getLogger(__name__)

HEADER = "authorization"
SCHEME = "bearer "


class TokenError(ConfigError):
    """A token file cannot be used; the message names the file and the fix."""


def _read_tokens(path: Path, what: str) -> tuple[bytes, ...]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise TokenError(f"{what} {path}: cannot be read ({exc.strerror}); check the path and its "
                         "permissions") from None
    except UnicodeDecodeError:
        raise TokenError(f"{what} {path}: is not text; it must hold the token on a line of its own") from None
    tokens = tuple(line.strip().encode() for line in text.splitlines() if line.strip())
    if not tokens:
        raise TokenError(f"{what} {path}: holds no token; write the token on a line of its own")
    return tokens


def read_client_token(path: str) -> str:
    """The token a client presents: the first non-empty line of ``path``.

    Raises:
        TokenError: The file is unreadable or empty.
    """
    return _read_tokens(Path(path), "--token-file")[0].decode()


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

    Args:
        path: The token file (the ``token_file`` setting).

    Raises:
        TokenError: The file is unreadable or holds no token.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._signature = self._stat()
        self._tokens = _read_tokens(self.path, "token_file")
        if self._signature and self._signature[3] & (stat.S_IROTH | stat.S_IWOTH):
            log.warning("event=token_file_open path=%s note='every user of this host can read it; chmod 0640 and "
                        "give the group to the operators who run chopper capture'", self.path)

    def _stat(self) -> tuple[int, int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)

    def _refresh(self) -> tuple[bytes, ...]:
        signature = self._stat()
        with self._lock:
            if signature is not None and signature != self._signature:
                self._signature = signature
                try:
                    self._tokens = _read_tokens(self.path, "token_file")
                    log.info("event=token_file_reloaded path=%s tokens=%d", self.path, len(self._tokens))
                except TokenError as exc:
                    log.warning("event=token_file_unusable error=%r note='the previous tokens stay in force'", str(exc))
            return self._tokens

    def accepts(self, token: bytes) -> bool:
        """Whether ``token`` is one of the file's tokens (constant time in the token's content)."""
        matched = False
        for good in self._refresh():
            matched |= hmac.compare_digest(token, good)
        return matched
