"""Comparing batches of tensors exactly (shared by the loader tests)."""

from __future__ import annotations

import torch


def copies(batches):
    """Batches detached from their shared-memory slots."""
    return [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in batches]  # fmt: skip


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert set(a) == set(b)
        for key in b:
            if isinstance(b[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key
