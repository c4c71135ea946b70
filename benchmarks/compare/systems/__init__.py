"""One module per system. Each module defines

- LABEL: the name in tables and plots; LAYOUT: one sentence on the format and reader settings;
- write(source, out, options): build the system's native format in folder `out` from the
  source's documents (timed by the caller);
- prepare(out, source, options) (optional): what a first run does once and later runs reuse,
  such as Megatron's index cache, so that time to first batch is measured warm for everyone;
- loader(out, source, options): the iterable of batches its documentation recommends for LLM
  pretraining, through a torch DataLoader with options.num_workers workers;
- input_ids(batch): the batch's [batch_size, seq_len] int64 input ids.
"""

from __future__ import annotations

import importlib
from types import ModuleType

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
