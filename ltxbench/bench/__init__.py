"""Benchmarks: timing primitives (timing.py), kernel micro benchmarks (micro.py), end-to-end runs."""
