# syntax=docker/dockerfile:1
# gpuload image: the exporter (gpuload serve) and the alert relay (gpuload relay). The image asks
# the NVIDIA container runtime for nothing: the exporter's container asks for the GPUs and the
# driver's management library, so that a relay started from the same image gets no GPU:
#   docker run --gpus all -e NVIDIA_DRIVER_CAPABILITIES=utility -p 19400:19400 ghcr.io/gpuload/gpuload:0.1.0
#   (or --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=all -e NVIDIA_DRIVER_CAPABILITIES=utility)
# utility mounts NVML and nvidia-smi only: an exporter needs no CUDA compute libraries. The Helm
# chart's DaemonSet sets both variables on the exporter container.
# Build: docker build --build-arg VERSION=0.1.0 --build-arg SOURCE=<repository URL> -t gpuload .

# Both stages start from one multi-arch index of python:3.12-slim (linux/amd64 and linux/arm64
# among its platforms), pinned by digest: the tag moves with every upstream rebuild, the digest
# does not. To move on: `docker buildx imagetools inspect python:3.12-slim` prints the index
# digest ("Digest:"); put it here and rebuild.
ARG PYTHON_IMAGE=python:3.12-slim@sha256:229a2c5bfa27522db7815ea81f9bed70af17ccb9de9fc7ad142b1877b5830d36

# Stage 1: build the wheel. Only the packaging inputs are copied, so that edits to
# tests or scripts do not invalidate this layer.
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# exporter/alerting/data/ links to these two; the wheel carries their contents.
COPY alert_rules/thresholds.yaml ./alert_rules/thresholds.yaml
COPY docs/runbooks.md ./docs/runbooks.md
RUN pip wheel --no-cache-dir --no-deps -w /dist .

# Stage 2: the runtime. Nothing from stage 1 but the wheel, and the wheel itself is only
# bind-mounted for the install, so no build tool, source tree or wheel file stays in a layer.
FROM ${PYTHON_IMAGE}

# The dependencies first, in a layer of their own that only a change of the lock file rebuilds:
# exact versions, and pip refuses any file whose sha256 requirements/image.txt does not list
# (scripts/lock-image writes it from pyproject.toml). Binary wheels only: every dependency has
# one for CPython 3.12 on x86_64 and arm64, and failing here beats silently needing a compiler.
RUN --mount=type=bind,source=requirements/image.txt,target=/tmp/requirements.txt \
    pip install --no-cache-dir --require-hashes --no-deps --only-binary=:all: \
       -r /tmp/requirements.txt

# A fixed numeric uid, so that Kubernetes' runAsNonRoot can verify it without /etc/passwd.
# NVML's read-only queries need no root; the toolkit's device nodes are world-accessible.
RUN groupadd --gid 10001 gpuload \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpuload
# The relay keeps its queue in its working directory by default (queue.path: gpuload-relay.db):
# a folder of its own, writable by the user below even with a read-only root filesystem when
# a volume is mounted there (the Helm chart mounts one).
RUN mkdir -p /var/lib/gpuload && chown 10001:10001 /var/lib/gpuload

# The version changes with every release: declared after the layers above, so that a new
# VERSION does not rebuild them.
ARG VERSION=0.1.0
ARG SOURCE=""
LABEL org.opencontainers.image.title="gpuload" \
      org.opencontainers.image.description="Prometheus exporter of GPU load (NVML) for machine-learning clusters" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

# gpuload itself, without dependencies: they are all in the layer above, and `pip check` fails
# the build if the lock file misses one that the wheel asks for. pip goes afterwards: nothing at
# run time installs packages, and one tool fewer is one CVE report fewer.
RUN --mount=type=bind,from=build,source=/dist,target=/dist \
    pip install --no-cache-dir --no-deps /dist/*.whl \
    && pip check \
    && pip uninstall -y pip

WORKDIR /var/lib/gpuload
USER 10001:10001

ENV PYTHONUNBUFFERED=1

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
