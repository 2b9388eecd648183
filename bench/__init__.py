"""Benchmarks: scenario scripts and the :mod:`bench.perf` load generator (see README.md)."""
