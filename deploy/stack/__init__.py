"""``make stack`` / ``python -m deploy.stack``: the whole Chopper stack on one machine, without Docker.

``config.py`` writes the Prometheus and Alertmanager configuration, ``services.py`` starts,
probes and stops processes, ``cli.py`` puts them together (README, "Local stack").
"""
