"""What a batch carries so that ``model(**batch)`` is right for a Hugging Face causal LM as
shipped, and what a DataLoader that batches on its own makes of shardtok's items.

Isolation. transformers (from 4.54, ``masking_utils``) keeps packed documents apart when it
gets ``position_ids`` that restart at 0, no ``attention_mask`` and no KV cache. A stock config
has ``use_cache=True``, and the model then makes a cache in every forward, training included:
the packed documents silently attend to each other (a packed conversation's logits 0.9 away from
the same conversation alone, eager and SDPA alike). So every batch says ``use_cache=False``:
the model builds no cache and its own packed-sequence detection isolates the documents under
eager, SDPA and flex attention, and flash attention derives ``cu_seqlens`` from the same
``position_ids``. No B·S² mask is built or moved: the model makes the one it needs from
``position_ids`` on its own device.

Labels. A shifted batch (the default) also carries ``shift_labels``, the same tensor as
``labels``: transformers' causal-LM loss takes pre-shifted targets by that name and does not
shift them again, so ``model(**batch).loss`` trains the right targets in either label format.

A DataLoader's own batching. ``DataLoader(ds, batch_size=N)`` collates N items with torch's
default collate, which copies the first item and fills it. A shardtok batch refuses to be
collated again (it would nest batches, or fail on ``cu_seqlens`` of different lengths); a
single sequence (a dataset built without ``batch_size``) collates into a batch that says
``use_cache=False`` as well. transformers' Trainer batches with a collator of its own, which
makes plain dicts; it sets ``use_cache=False`` on the model itself.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import warnings

import torch
from torch.utils.data._utils.collate import collate as _torch_collate

from shardtok.errors import UsageError

_COLLATE = _torch_collate.__code__

_NESTED = (
    "this ShardStreamDataset builds whole batches (batch_size={size} on the dataset), and a "
    "DataLoader with batch_size set would batch them again: write DataLoader(ds, "
    "batch_size=None, ...) or shardtok.torch.ShardLoader(ds, num_workers=...), or build the "
    "dataset without batch_size to get single sequences for the DataLoader to batch"
)


def _collated_by_torch() -> bool:
    # Called from refuse_collation (1) or __copy__ (1), from __copy__ (2), which copy.copy
    # (2 or 3) calls for torch's collate (3 or 4).
    caller = sys._getframe(3)
    outer = caller.f_back
    return caller.f_code is _COLLATE or (outer is not None and outer.f_code is _COLLATE)


ISOLATING_TRANSFORMERS = (4, 54)  # masking_utils' packed-sequence detection (eager, SDPA, flex)
_warned: list[bool] = []


def _installed_transformers() -> str | None:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def warn_if_transformers_mixes(labels_format: str) -> None:
    """Once per process, for a dataset made for Hugging Face models: warn when the installed
    transformers predates its isolation of packed documents by ``position_ids``."""
    version = _installed_transformers() if labels_format == "hf" and not _warned else None
    if version is None:
        return
    release = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if release >= ISOLATING_TRANSFORMERS:
        return
    _warned.append(True)
    warnings.warn(
        f"transformers {version} lets packed documents attend to each other under eager and SDPA "
        "attention (it isolates them by position_ids from 4.54 on): install transformers>=4.54, "
        "or run flash_attention_2, or give the model a block-causal mask (docs/MODELS.md)",
        stacklevel=3,
    )


def refuse_collation(batch_size: int) -> None:
    """For a whole batch's ``__copy__``: the one-line refusal when torch's collate copies it
    (a DataLoader with batch_size set, batching batches)."""
    if _collated_by_torch():
        raise UsageError(_NESTED.format(size=batch_size))


class Batch(dict):
    """A packed batch: tensors under the keys of docs/STREAMING.md, and plain values."""

    __slots__ = ()

    def __copy__(self) -> Batch:
        refuse_collation(len(self["input_ids"]))
        return Batch(self)


class Sample(dict):
    """One sequence of a dataset built without ``batch_size``: 1-D tensors and plain values."""

    __slots__ = ()

    def __copy__(self) -> dict:
        if _collated_by_torch():  # the clone that torch's collate fills becomes the batch
            return Batch(self, use_cache=False)
        return Sample(self)


def model_batch(batch: dict, labels_format: str) -> Batch:
    """`batch` with ``use_cache=False``, and ``shift_labels`` when its labels are shifted."""
    out = Batch(batch)
    out["use_cache"] = False
    if labels_format == "shifted":
        out["shift_labels"] = out["labels"]
    return out


def model_sample(batch: dict, labels_format: str) -> Sample:
    """The one row of a batch of one, as a ``Sample``: ``input_ids``, ``labels``,
    ``position_ids``, ``document_ids`` as [S] tensors, ``num_trained_tokens`` and
    ``source_ids`` as 0-d tensors (a DataLoader stacks them into [N]); ``cu_seqlens`` and
    ``max_seqlen`` describe a whole batch, so a sample has none."""
    out = Sample(
        input_ids=batch["input_ids"][0],
        labels=batch["labels"][0],
        position_ids=batch["position_ids"][0],
        document_ids=batch["document_ids"][0],
        num_trained_tokens=torch.tensor(int(batch["num_trained_tokens"])),
        source_ids=batch["source_ids"][0],
    )
    if labels_format == "shifted":
        out["shift_labels"] = out["labels"]
    return out


__all__ = [
    "Batch",
    "Sample",
    "model_batch",
    "model_sample",
    "refuse_collation",
    "warn_if_transformers_mixes",
]
