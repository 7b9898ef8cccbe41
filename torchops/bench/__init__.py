"""Benchmarks: `python -m torchops.bench --help`."""
