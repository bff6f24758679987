"""Helpers that test modules share: real daemons and in-process servers, fakes at the vendor and systemd
seams, clocks, Prometheus, training jobs, PKI, trace data, scenarios.

Test modules import shared helpers from here only, never from each other or from a conftest; a
conftest.py holds fixtures, built on these. tests/test_support_imports.py checks this.
"""
