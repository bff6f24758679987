"""What both daemons (``agent`` and ``aggregator``) are built from; nothing here runs in a training process.

Settings from defaults, YAML, environment and flags (``settings``); gRPC serving with access checks,
TLS and bearer tokens (``serving``, ``access``, ``ratelimit``, ``tls``, ``auth``, ``grpc_decode``,
``listen_check``); metric catalogs' exposition, guarded ``collect()`` sections and catalog docs
(``exposition``); ``/metrics`` over HTTP (``metrics_http``); process life under systemd and signals
(``entrypoint``: the shared ``main``, ``sdnotify``, ``stopsignals``, ``logs``).
"""
