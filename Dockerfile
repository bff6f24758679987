# syntax=docker/dockerfile:1
# Chopper telemetry: one image for chopper-agent (the default command) and chopper-aggregator.
# README, "Container image", says how to run each and which devices, groups and mounts they need.
#   docker build -t chopper .                                   # simulated/replay backends, aggregator
#   docker build --build-arg EXTRAS=nvidia -t chopper:nvidia .   # + nvidia-ml-py (NVML from the NVIDIA toolkit)
#   docker build --build-arg EXTRAS=amd -t chopper:amd .         # + amdsmi (libamd_smi from a mounted ROCm)
#   docker build --target demo -t chopper:demo .                 # + CPU PyTorch: the demo training job
# Pin PYTHON_IMAGE by digest (python:3.11.13-slim-bookworm@sha256:...) in your registry mirror.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# -- build: the package and its dependencies in a venv that the runtime stages copy ---------------
FROM ${PYTHON_IMAGE} AS build
# Optional extras: "amd", "nvidia" or "amd,nvidia" (the vendor library of the agent's backend).
ARG EXTRAS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY chopper ./chopper
COPY agent ./agent
COPY aggregator ./aggregator
RUN python -m venv /opt/chopper/venv \
    && /opt/chopper/venv/bin/pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}"

# The demo job's PyTorch: the CPU build, from PyTorch's own index (PyPI's default pulls CUDA).
FROM build AS demo-build
ARG TORCH_VERSION=2.13.0
RUN /opt/chopper/venv/bin/pip install --no-cache-dir \
    --extra-index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"

# -- base: what both runtime images share --------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
# A fixed non-root uid/gid 10001 (the socket group on every target: sysusers, Kubernetes), so that the
# agent socket volume is shared with trainers of that group. /run/chopper: agent.sock; /var/lib/chopper: the store.
RUN groupadd --system --gid 10001 chopper \
    && useradd --system --uid 10001 --gid chopper --home-dir /var/lib/chopper --no-create-home \
       --shell /usr/sbin/nologin chopper \
    && install -d -o chopper -g chopper -m 0750 /run/chopper /var/lib/chopper
ENV PATH=/opt/chopper/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# -- demo: the 2-rank CPU training job that marks steps into the agent's socket ------------------
FROM base AS demo
COPY --from=demo-build /opt/chopper/venv /opt/chopper/venv
USER 10001:10001
CMD ["python", "-m", "chopper.demo.train", "--agent", "unix:///run/chopper/agent.sock", "--duration", "31536000"]

# -- runtime (the default target): chopper-agent and chopper-aggregator --------------------------
FROM base AS runtime
COPY --from=build /opt/chopper/venv /opt/chopper/venv
# In a container the daemons serve other containers and hosts, not only loopback.
ENV CHOPPER_AGENT_METRICS_LISTEN=0.0.0.0:9477 \
    CHOPPER_AGGREGATOR_LISTEN=0.0.0.0:9480 \
    CHOPPER_AGGREGATOR_METRICS_LISTEN=0.0.0.0:9481 \
    CHOPPER_AGGREGATOR_STORE_DIR=/var/lib/chopper/steps \
    CHOPPER_HEALTH_URL=http://127.0.0.1:9477/metrics
# 9477: agent /metrics; 9480: aggregator gRPC; 9481: aggregator /metrics.
EXPOSE 9477 9480 9481
USER 10001:10001
# Healthy while /metrics answers; the aggregator's container sets CHOPPER_HEALTH_URL to port 9481.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['CHOPPER_HEALTH_URL'], timeout=4)"]
CMD ["chopper-agent"]
