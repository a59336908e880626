"""Shared fixtures: one real Prometheus per test session for the metering tests; no proxy
settings from the developer's environment (metering honours HTTP(S)_PROXY, and the tests talk
to servers on 127.0.0.1: tests/test_proxy.py sets the variables it is about)."""

import pytest

pytest_plugins = ["conftest_prom"]

PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
              "ALL_PROXY", "no_proxy", "NO_PROXY")


@pytest.fixture(autouse=True)
def _no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
