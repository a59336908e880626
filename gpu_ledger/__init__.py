"""The `gpu-ledger` command: one entry point that dispatches to the exporter and metering."""
