"""The rendered dashboards checked against Grafana's published TypeScript schema (``tscheck.py``)."""
