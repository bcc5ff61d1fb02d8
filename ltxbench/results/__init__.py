"""Benchmark result documents: schema (schema.py), environment capture (env.py), files on disk (io.py).

Nothing heavy is imported here; pandas is only imported by `io.to_frame` when a CSV is written.
"""
