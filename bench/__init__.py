"""Benchmarks (not tests): exporter scrape and cycle cost, metering throughput and memory.

`python -m bench.exporter_scrape` and `python -m bench.metering` print the figures that
docs/performance.md records; `--quick` runs a smaller version of each for smoke checks.
"""
