"""The top-level keys a Kineto trace writes before ``traceEvents``, read once, at C speed.

Kineto writes its metadata (``schemaVersion``, ``deviceProperties``, ``distributedInfo``, ...)
ahead of the event list. :func:`split_head` decodes those keys with ``json`` (C scanner) and stops
at the ``[`` that opens ``traceEvents``, returning the bytes it read past it, so the event
parser continues from there on the same stream: no key is parsed twice and the file is
decompressed once.

Algorithm:
    1. Read the stream in chunks into a text buffer (incremental UTF-8 decoding).
    2. Walk the top-level object: a key (``raw_decode``), ``:``, and then either ``traceEvents``,
       whose ``[`` ends the walk, or a value (``raw_decode``) followed by ``,``.
    3. A key or value that reaches the end of the buffer may be cut by the chunk boundary: read
       at least as much again as the buffer holds and retry. The read size doubles, so a value of
       ``n`` bytes is decoded O(log n) times on O(n) bytes in all: linear.
    4. What has been walked is dropped from the buffer, so it holds one value at a time.
"""
from __future__ import annotations

import codecs
import json
from typing import Any

from chopper.trace.nesting import Readable

_CHUNK = 1 << 16
_SPACE = " \t\n\r"


class HeadError(ValueError):
    """The stream is not a JSON object with a ``traceEvents`` list.

    Attributes:
        kind: ``"list"`` (the JSON is an array), ``"no_events"`` (an object without the key),
            ``"events_not_list"`` or ``"invalid"`` (not JSON, or cut short); the message says more.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Buffer:
    """Decoded text of a stream, read on demand."""

    def __init__(self, fh: Readable) -> None:
        self._fh = fh
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self.text = ""
        self.pos = 0
        self.eof = False

    def more(self) -> bool:
        """Read at least as much again as the buffer holds; False at the end of the stream."""
        if self.eof:
            return False
        self.text = self.text[self.pos:]
        self.pos = 0
        want = max(_CHUNK, len(self.text))
        got = 0
        while got < want:
            data = self._fh.read(want - got)
            if not data:
                self.text += self._decoder.decode(b"", final=True)
                self.eof = True
                break
            got += len(data)
            self.text += self._decoder.decode(data)
        return True

    def peek(self) -> str:
        """The next character that is not white space ("" at the end of the stream)."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in _SPACE:
                self.pos += 1
            if self.pos < len(self.text) or not self.more():
                return self.text[self.pos:self.pos + 1]

    def expect(self, chars: str, what: str) -> str:
        ch = self.peek()
        if not ch or ch not in chars:
            found = repr(ch) if ch else "the end of the file"
            raise HeadError("invalid", f"expected {what} but found {found}")
        self.pos += 1
        return ch

    def value(self) -> Any:
        """The JSON value at the cursor; retried with more text while it may be cut short."""
        self.peek()
        decoder = json.JSONDecoder()
        while True:
            try:
                value, end = decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                # Only an error at the end of the text can be a value cut by the chunk boundary
                # (an unterminated string always runs to the end); anything else is refused at once.
                cut = exc.msg.startswith("Unterminated string") or exc.pos >= len(self.text) - 6
                if cut and self.more():
                    continue
                raise HeadError("invalid", f"{exc.msg} at character {exc.pos} of the top-level object") from exc
            # A number (or literal) that ends the buffer may continue in the next chunk.
            if end >= len(self.text) and self.more():
                continue
            self.pos = end
            return value

    def rest(self) -> bytes:
        """The bytes read past the cursor, undecoded again."""
        pending, _ = self._decoder.getstate()
        return self.text[self.pos:].encode() + pending


def split_head(fh: Readable) -> tuple[dict[str, Any], bytes]:
    """Read the top-level keys before ``traceEvents`` and stop at its opening ``[``.

    Args:
        fh: A binary stream at the start of a Kineto trace.

    Returns:
        The keys before ``traceEvents`` with their values, and the bytes already read from ``fh``
        past the ``[`` (the start of the event list).

    Raises:
        HeadError: the JSON is a list, or not an object, or has no ``traceEvents`` list before
            its end.
        UnicodeDecodeError: the head is not UTF-8 text.
        RecursionError: a value nests deeper than ``json`` recurses (bound the depth first).
    """
    buf = _Buffer(fh)
    first = buf.peek()
    if first == "[":
        raise HeadError("list", "the JSON is a list, not a Kineto trace object")
    buf.expect("{", "a JSON object '{'")
    meta: dict[str, Any] = {}
    if buf.peek() == "}":
        raise HeadError("no_events", "no 'traceEvents' list")
    while True:
        if buf.peek() != '"':
            raise HeadError("invalid", "expected a key string in the top-level object")
        key = buf.value()
        buf.expect(":", "':' after a key")
        if key == "traceEvents":
            if buf.peek() != "[":
                raise HeadError("events_not_list", "'traceEvents' is not a list")
            buf.pos += 1
            return meta, buf.rest()
        meta[key] = buf.value()
        if buf.expect(",}", "',' or '}'") == "}":
            raise HeadError("no_events", "no 'traceEvents' list")
