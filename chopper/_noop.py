"""The marker context manager that does nothing: what ``chopper.step`` and its siblings return before ``init``.

Its own module, free of imports, so that ``import chopper`` does not load the client to have it.
"""
from __future__ import annotations


class _NoOp:
    """The context manager returned before ``init``: does nothing, counts nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoOp:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NOOP = _NoOp()
