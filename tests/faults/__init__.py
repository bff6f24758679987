"""Fault-injection suite: real processes under faults, each measured into a ``docs/RELIABILITY.md`` row."""
