"""Deprecated name of ``chopper.pytorch``, kept for one release: importing it warns and re-exports it.

The old name shadowed ``torch`` in tracebacks and in readers' minds; ``import chopper.pytorch``
is the same module.
"""
from __future__ import annotations

import warnings

from chopper.pytorch import *  # noqa: F403 (re-export of the whole public API)
from chopper.pytorch import __all__  # noqa: F401

warnings.warn("chopper.torch is deprecated and will be removed in the next release: import chopper.pytorch",
              DeprecationWarning, stacklevel=2)
