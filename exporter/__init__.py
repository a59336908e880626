"""GPU Ledger node exporter: NVML readings attributed to pods, served to Prometheus."""

__version__ = "0.1.0"
