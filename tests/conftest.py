"""Shared fixtures: one real Prometheus per test session for the metering tests."""

pytest_plugins = ["conftest_prom"]
