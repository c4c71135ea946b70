"""One module per system. Each module defines

- LABEL: the name in tables and plots; LAYOUT: one sentence on the format and reader settings;
- write(source, out, options): build the system's native format in folder `out` from the
  source's documents (timed by the caller);
- prepare(out, source, options) (optional): what a first run does once and later runs reuse,
  such as Megatron's index cache, so that time to first batch is measured warm for everyone;
- loader(out, source, options): the iterable of batches its documentation recommends for LLM
  pretraining, through a torch DataLoader with options.num_workers workers;
- training_inputs(batch): what a training step takes from the batch, each [batch_size, seq_len]
  int64: (input_ids, labels, position_ids). Work a training loop would do on a peer's batch (the
  `.long()` of LitGPT's loop, for instance) is done here, inside the timed loop; a system
  without document-aware positions gives `arange_positions`, the one position row every model
  builds for itself, at no cost.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

NAMES = (
    "shardtok_stream",
    "shardtok_memmap",
    "webdataset_tar",
    "mosaic_mds",
    "litdata_tokens",
    "megatron_gpt",
    "numpy_memmap",
)


def load(name: str) -> ModuleType:
    if name not in NAMES:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"benchmarks.compare.systems.{name}")


_POSITIONS: dict[tuple[int, int], torch.Tensor] = {}


def arange_positions(batch_size: int, seq_len: int) -> torch.Tensor:
    """0 .. seq_len - 1 in every row, as a broadcast view (built once per shape)."""
    key = (batch_size, seq_len)
    if key not in _POSITIONS:
        _POSITIONS[key] = torch.arange(seq_len, dtype=torch.int64).expand(batch_size, seq_len)
    return _POSITIONS[key]
