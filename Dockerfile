# syntax=docker/dockerfile:1
# GPU Ledger: one image for the exporter DaemonSet and the metering CronJob.
#   docker build -t ghcr.io/gpu-ledger/gpu-ledger:0.1.0 .
# No GPU library is baked in: the NVIDIA container runtime mounts the node driver's
# libnvidia-ml.so.1 at run time (deploy/base/exporter-daemonset.yaml).
#
# Reproducible: the base image is pinned by digest and every dependency is installed from
# requirements.lock with its sha256 checked, so two builds install the same files.
# Refresh both deliberately (docs/operations.md, "Image and dependencies"):
#   make lock                                          # requirements.lock from pyproject.toml
#   docker buildx imagetools inspect python:3.11-slim  # the index digest, for both FROMs
# The simulator (gpusim/) is not copied: the image holds the product only, and installs only the
# runtime dependencies (no `sim`/`dev` extras).

# --- build: the project's own wheel, with the base image's setuptools ---------------------------
FROM python:3.11-slim@sha256:90744cff8f32887f075c47d747a173ff333e9e98801667af93c357fa9f5e28ff AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml ./
COPY gpu_ledger ./gpu_ledger
COPY exporter ./exporter
COPY metering ./metering
COPY alerts ./alerts
COPY dashboards ./dashboards
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .

# --- run: the locked dependencies (hashes required), then the project without dependencies --
FROM python:3.11-slim@sha256:90744cff8f32887f075c47d747a173ff333e9e98801667af93c357fa9f5e28ff
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.lock /tmp/requirements.lock
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --require-hashes --only-binary=:all: --no-deps -r /tmp/requirements.lock \
    && pip install --no-index --no-deps /wheels/gpu_ledger-*.whl \
    && rm /tmp/requirements.lock \
    && groupadd --gid 65532 gpu-ledger \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpu-ledger
# Non-root by default. The exporter DaemonSet sets runAsUser 0 (no capabilities) where the
# kubelet's PodResources socket admits only root; the metering CronJob runs as this user.
USER 65532:65532
# OCI image annotations; the DaemonSet's pod template carries the same ones.
LABEL org.opencontainers.image.title="gpu-ledger" \
      org.opencontainers.image.source="https://github.com/gpu-ledger/gpu-ledger" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
EXPOSE 9847
ENTRYPOINT ["gpu-ledger"]
CMD ["--help"]
