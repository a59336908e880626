"""GPU Ledger metering: hourly GPU facts from Prometheus into DuckDB, priced per team."""

__version__ = "0.1.0"
