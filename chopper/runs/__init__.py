"""Recorded runs and captures: read a live agent, write a run directory, read it back, join it with traces.

``connect`` and ``consumer`` reach a running agent; ``record`` and ``capture`` write what it streams
(``rundir`` is the directory format); ``capture_join`` puts a capture's counters beside its kernels;
``steptable`` prints live step summaries.
"""
