# syntax=docker/dockerfile:1
# GPU Ledger: one image for the exporter DaemonSet and the metering CronJob.
#   docker build -t ghcr.io/gpu-ledger/gpu-ledger:0.1.0 .
# No GPU library is baked in: the NVIDIA container runtime mounts the node driver's
# libnvidia-ml.so.1 at run time (deploy/base/exporter-daemonset.yaml).

# --- build: the project's wheel and wheels for every dependency --------------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml ./
COPY gpu_ledger ./gpu_ledger
COPY exporter ./exporter
COPY metering ./metering
COPY alerts ./alerts
COPY dashboards ./dashboards
RUN pip wheel --wheel-dir /wheels .

# --- run: installed from those wheels alone, no compilers, no build files ---------------------
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels gpu-ledger \
    && groupadd --gid 65532 gpu-ledger \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpu-ledger
# Non-root by default. The exporter DaemonSet sets runAsUser 0 (no capabilities) where the
# kubelet's PodResources socket admits only root; the metering CronJob runs as this user.
USER 65532:65532
EXPOSE 9847
ENTRYPOINT ["gpu-ledger"]
CMD ["--help"]
