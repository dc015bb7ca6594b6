"""Benchmarks, run by hand: `python -m benchmarks.<name> --help`."""
