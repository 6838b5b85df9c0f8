# syntax=docker/dockerfile:1
# gpuload image. Run it with the NVIDIA container toolkit, which mounts the driver's NVML:
#   docker run --gpus all -p 19400:19400 gpuload
# Build: docker build --build-arg VERSION=0.1.0 --build-arg SOURCE=<repository URL> -t gpuload .

# Stage 1: build the wheel. Only the packaging inputs are copied, so that edits to
# tests or scripts do not invalidate this layer.
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# exporter/alerting/data/ links to these two; the wheel carries their contents.
COPY alert_rules/thresholds.yaml ./alert_rules/thresholds.yaml
COPY docs/runbooks.md ./docs/runbooks.md
RUN pip wheel --no-cache-dir --no-deps -w /dist .

# Stage 2: the runtime. Nothing from stage 1 but the wheel, and the wheel itself is only
# bind-mounted for the install, so no build tool, source tree or wheel file stays in a layer.
FROM python:3.12-slim

ARG VERSION=0.1.0
ARG SOURCE=""
LABEL org.opencontainers.image.title="gpuload" \
      org.opencontainers.image.description="Prometheus exporter of GPU load (NVML) for machine-learning clusters" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

# Binary wheels only: every dependency has one for CPython 3.12 on x86_64 and arm64, and
# failing here beats silently needing a compiler. pip goes afterwards: nothing at run time
# installs packages, and one tool fewer is one CVE report fewer.
RUN --mount=type=bind,from=build,source=/dist,target=/dist \
    pip install --no-cache-dir --only-binary=:all: /dist/*.whl \
    && pip uninstall -y pip

# A fixed numeric uid, so that Kubernetes' runAsNonRoot can verify it without /etc/passwd.
# NVML's read-only queries need no root; the toolkit's device nodes are world-accessible.
RUN groupadd --gid 10001 gpuload \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpuload
# The relay keeps its queue in its working directory by default (queue.path: gpuload-relay.db):
# a folder of its own, writable by the user below even with a read-only root filesystem when
# a volume is mounted there (the Helm chart mounts one).
RUN mkdir -p /var/lib/gpuload && chown 10001:10001 /var/lib/gpuload
WORKDIR /var/lib/gpuload
USER 10001:10001

# Tell the NVIDIA container runtime to expose every GPU and only the driver's management
# library (NVML, nvidia-smi): an exporter needs no CUDA compute libraries.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    PYTHONUNBUFFERED=1

# 19400: the exporter (gpuload serve); 19401: the relay (gpuload relay).
EXPOSE 19400 19401

# slim has no curl; Python's urllib is already here. urlopen raises on connection errors
# and non-2xx answers, which makes the exit status non-zero. This follows the default
# port: change it here too if CMD sets another --web.listen-address. Kubernetes ignores it
# (the chart has its own probes), and `gpuload relay` containers should override it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:19400/healthz', timeout=4)"]

ENTRYPOINT ["gpuload"]
CMD ["serve"]
