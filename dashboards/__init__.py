"""Grafana dashboards for GPU Ledger, built with grafana-foundation-sdk.

`python -m dashboards.generate` rebuilds the committed JSON.
"""
