"""``chopper-aggregator``: placeholder entry point until the aggregator issue lands."""
from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Say plainly that the aggregator is not available yet; exit status 2."""
    print(
        "chopper-aggregator: not available in this release yet; per-node data is on each agent's "
        "/metrics and `chopper record` streams (see docs/ARCHITECTURE.md)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
