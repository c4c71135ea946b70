"""Benchmarks: bench_convert.py and bench_stream.py (scripts) and compare/ (the comparison harness)."""
