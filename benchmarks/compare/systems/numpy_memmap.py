"""A plain numpy memmap window loader (nanoGPT style): one flat token file, a map-style Dataset
whose item i is the window [i * (seq_len + 1), (i + 1) * (seq_len + 1)) converted to int64, and a
DataLoader(batch_size=8, shuffle=True). No document index, no packing logic: the floor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from benchmarks.compare.systems import arange_positions
from shardtok.format import MegatronPair

LABEL = "numpy memmap"
LAYOUT = "one flat token file; map-style Dataset of seq_len+1 windows; DataLoader(batch_size=8, shuffle=True)"

_CHUNK = 1 << 24  # tokens copied per step


def write(source, out: Path, options) -> None:
    tokens = MegatronPair(source.prefix).tokens
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tokens.bin", "wb") as f:
        for start in range(0, len(tokens), _CHUNK):
            f.write(np.asarray(tokens[start : start + _CHUNK]).tobytes())


class Windows(torch.utils.data.Dataset):
    def __init__(self, path: Path, dtype: str, seq_len: int):
        self.path = str(path)
        self.dtype = np.dtype(dtype)
        self.window = seq_len + 1
        self.length = (path.stat().st_size // self.dtype.itemsize) // self.window
        self.tokens: np.ndarray | None = None  # opened lazily, once per worker

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        start = i * self.window
        window = torch.from_numpy(self.tokens[start : start + self.window].astype(np.int64))
        return {"input_ids": window[:-1], "labels": window[1:]}


def loader(out: Path, source, options):
    return torch.utils.data.DataLoader(
        Windows(Path(out) / "tokens.bin", source.dtype, options.seq_len),
        batch_size=options.batch_size,
        shuffle=True,
        num_workers=options.num_workers,
        drop_last=True,
        generator=torch.Generator().manual_seed(options.seed),
    )


def training_inputs(batch):
    ids = batch["input_ids"]
    return ids, batch["labels"], arange_positions(*ids.shape)
