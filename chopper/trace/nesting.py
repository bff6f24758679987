"""A bound on JSON nesting, checked on the bytes before any parser sees them.

ijson builds a prefix string (``traceEvents.item.args.item...``) for every token, whose length
grows with the depth of the token: a document nested ``d`` deep costs O(d²) time and memory to
stream (a 150-byte ``.json.gz`` nested 40,000 deep took 4 GB). ``json`` recurses once per level.
Kineto writes at most ~8 levels (trace → events → event → args → shape lists of tensor lists), so
:data:`MAX_DEPTH` leaves ample room and makes every parser's cost per byte a constant.

The check is a file wrapper: each chunk read is scanned before it is handed on, with a state
(depth, inside a string, an escape pending) carried across chunks. The scan works on a reduced
copy of the chunk, built by C-speed ``bytes`` methods, so it costs a few percent of the parse:

1. Drop escaped backslashes (``\\\\``) and then escaped quotes (``\\"``): every quote left is a
   string delimiter. A chunk that ends in an unpaired backslash escapes the next chunk's first byte.
2. Keep only quotes and brackets (``bytes.translate``), then drop every pair of adjacent quotes:
   a string without brackets in it vanishes, and removing two quotes never changes the parity
   (inside / outside a string) of what remains.
3. On what is left (brackets, and the quotes of strings that hold brackets), a bracket counts only
   outside strings (an even number of quotes before it); the running sum of +1 for ``[``/``{`` and
   −1 for ``]``/``}`` is the depth, and its maximum is compared with the bound.

The scan is exact for well-formed JSON; on malformed JSON it may misjudge what follows the first
error, which the parser refuses anyway when it reaches that byte.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

MAX_DEPTH = 64
_KEEP = b'"[]{}'
_DROP = bytes(b for b in range(256) if b not in _KEEP)
_STEP = np.zeros(256, dtype=np.int32)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_QUOTE = ord('"')


class Readable(Protocol):
    """What the readers need of a stream: ``read(n)`` returning bytes, ``b""`` at its end."""

    def read(self, n: int = -1, /) -> bytes: ...


class TooDeep(ValueError):
    """JSON nested deeper than the bound; ``depth`` is the first depth seen beyond it."""

    def __init__(self, depth: int, limit: int) -> None:
        super().__init__(f"JSON nested {depth} levels deep, more than the {limit} levels allowed")
        self.depth = depth
        self.limit = limit


class NestingGuard:
    """File wrapper whose ``read`` raises :class:`TooDeep` once the JSON read so far nests too deep.

    Args:
        fh: A binary stream of JSON text (e.g. an open ``.json`` or a ``gzip`` stream).
        limit: Deepest nesting allowed; the top-level object or array is depth 1.
    """

    def __init__(self, fh: Readable, limit: int = MAX_DEPTH) -> None:
        self._fh = fh
        self.limit = limit
        self.depth = 0
        self._in_string = False
        self._escape_next = False

    def read(self, n: int = -1, /) -> bytes:
        data = self._fh.read(n)
        if data:
            self._scan(data)
        return data

    def _scan(self, data: bytes) -> None:
        if self._escape_next:  # the byte after a backslash that ended the previous chunk
            data, self._escape_next = data[1:], False
        if b"\\" in data:
            data = data.replace(b"\\\\", b"")
            if data.endswith(b"\\"):
                data, self._escape_next = data[:-1], True
            data = data.replace(b'\\"', b"")
        kept = data.translate(None, _DROP).replace(b'""', b"")
        if not kept:
            return
        marks = np.frombuffer(kept, dtype=np.uint8)
        steps = _STEP[marks]
        quotes = marks == _QUOTE
        if quotes.any() or self._in_string:
            inside = (np.cumsum(quotes, dtype=np.int64) + self._in_string) % 2 == 1
            steps[inside] = 0
            self._in_string = bool(inside[-1])
        depth = np.cumsum(steps, dtype=np.int64)
        depth += self.depth
        deepest = int(depth.max())
        self.depth = int(depth[-1])
        if deepest > self.limit:
            raise TooDeep(deepest, self.limit)
