"""The Chopper cluster aggregator: job-level attribution, stragglers, Prometheus and a Parquet store.

Agents deliver step summaries over ``chopper.v1.Aggregator/Deliver`` (``server.py``); the delivery
ledger (``ledger.py``) drops resends; ``jobs.py`` joins the ranks of each job by ``(job, step)``,
finalizes steps and rolls them up; ``store.py`` writes the finalized rows; ``metrics.py`` exports
``catalog.py``'s metrics; ``config.py`` and ``main.py`` make the ``chopper-aggregator`` daemon.
"""
