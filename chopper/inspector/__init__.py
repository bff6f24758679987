"""NCCL/RCCL Inspector dumps: the record format (``format``); the agent's reader is ``agent.inspector``."""
from __future__ import annotations

from chopper.inspector.format import (
    KNOWN_COLLECTIVES,
    REJECTION_REASONS,
    SUPPORTED_VERSIONS,
    TIMING_SOURCES,
    DumpStats,
    InspectorFormatError,
    InspectorRecord,
    RecordContext,
    RecordDecoder,
    parse_context,
    parse_dump_stats,
    parse_line,
    parse_record,
    record_kind,
)

__all__ = [
    "KNOWN_COLLECTIVES",
    "REJECTION_REASONS",
    "SUPPORTED_VERSIONS",
    "TIMING_SOURCES",
    "DumpStats",
    "InspectorFormatError",
    "InspectorRecord",
    "RecordContext",
    "RecordDecoder",
    "parse_context",
    "parse_dump_stats",
    "parse_line",
    "parse_record",
    "record_kind",
]
