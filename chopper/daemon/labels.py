"""The label that names the training job on both daemons' /metrics, and the values of their ``job_label``.

``JOB_LABEL`` is the catalogs' name for it; it never collides with Prometheus' own ``job`` (the
scrape job), so a plain scrape config needs no ``honor_labels``. ``job`` is the behaviour of
earlier releases, kept for one release (``chopper.daemon.exposition.Families`` renames it).
"""
from __future__ import annotations

JOB_LABEL = "training_job"
JOB_LABELS = (JOB_LABEL, "job")
