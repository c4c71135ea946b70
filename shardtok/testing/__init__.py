"""Synthetic datasets and the save/restore checker, for tests and benchmarks (not for training)."""
