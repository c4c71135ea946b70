"""Comparing batches of tensors exactly (shared by the loader tests)."""

from __future__ import annotations

import torch


def copies(batches):
    """Batches detached from their shared-memory slots."""
    return [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in batches]  # fmt: skip


MODEL_KEYS = ("use_cache", "shift_labels")  # what a batch adds for model(**batch)


def check_model_keys(batch) -> dict:
    """`batch`'s data keys, once the keys it carries for a model are checked."""
    if "use_cache" in batch:
        assert batch["use_cache"] is False
    if "shift_labels" in batch:
        shifted, labels = (torch.as_tensor(batch[k]) for k in ("shift_labels", "labels"))
        assert torch.equal(shifted, labels)
    return {k: v for k, v in batch.items() if k not in MODEL_KEYS}


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        a, b = check_model_keys(a), check_model_keys(b)
        assert set(a) == set(b)
        for key in b:
            if isinstance(b[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key
