"""Helpers that test modules share: real daemons, Prometheus, training jobs, PKI, trace data, scenarios.

Test modules import shared helpers from here only, never from each other or from a conftest; a
conftest.py holds fixtures, built on these.
"""
