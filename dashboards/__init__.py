"""Grafana dashboards and Prometheus recording and alert rules, built from the metric catalogs.

``python -m dashboards`` (``make dashboards``) renders everything this package defines into the
committed files: ``dashboards/json/*.json`` (Grafana), ``dashboards/rules/rules.yaml``
(Prometheus), the Kubernetes ``PrometheusRule`` and dashboard ``ConfigMap`` under
``deploy/kubernetes/base/generated/`` and ``docs/ALERTS.md``. A test fails when they are stale.
"""
