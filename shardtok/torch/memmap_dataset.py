"""The memmap path: a map-style Dataset with Megatron GPTDataset samples over local data.

For a Megatron ``.bin/.idx`` pair or a shardtok dataset written without compression. Sample
``i`` is exactly Megatron's (``GPTSamples``: document, sample and shuffle indices, separate
last epoch); it comes out with the same keys as the streaming batches::

    ds = MemmapTokenDataset("data/", seq_len=2048, num_samples=1_000_000, seed=1234)
    loader = DataLoader(ds, batch_size=8, collate_fn=ds.collate, num_workers=2,
                        sampler=DistributedSampler(ds))  # when data-parallel

``collate`` builds the batch in the worker (in shared memory, like the streaming dataset).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
from torch.utils.data import Dataset, get_worker_info

from shardtok.memmap.samples import GPTSamples
from shardtok.memmap.tokens import open_local_tokens
from shardtok.stream.batch import (
    Allocator,
    allocate_arrays,
    assemble_contiguous_batch,
    build_batch,
    check_labels_format,
)
from shardtok.stream.sequence import PackedSequence
from shardtok.torch.transport import SlotRing, to_tensors


class MemmapTokenDataset(Dataset):
    def __init__(
        self,
        path: str | Path,
        *,
        seq_len: int,
        num_samples: int | None = None,
        seed: int = 1234,
        cache_dir: str | os.PathLike[str] | None = None,
        mask_boundary_labels: bool = False,
        labels_format: str = "shifted",
        shared_memory: bool = True,
    ):
        self.path = str(path)
        self.seq_len = seq_len
        self.num_samples = num_samples
        self.seed = seed
        self.cache_dir = cache_dir
        self.mask_boundary_labels = mask_boundary_labels
        check_labels_format(labels_format)  # here, not in a worker's collate
        self.labels_format = labels_format
        self.shared_memory = shared_memory
        self._samples: GPTSamples | None = None
        self._ring: SlotRing | None = None
        self._length = len(self.samples)

    @property
    def samples(self) -> GPTSamples:
        if self._samples is None:  # opened per process: memmaps are not pickled to workers
            tokens, sizes = open_local_tokens(self.path)
            samples = GPTSamples(
                tokens,  # type: ignore[arg-type]  # ConcatTokens indexes like an ndarray
                sizes,
                self.seq_len,
                self.num_samples,
                self.seed,
                cache_dir=self.cache_dir,
            )
            self._samples = samples
        return self._samples

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_samples": None, "_ring": None}

    def __len__(self) -> int:
        return self._length

    def sequence(self, i: int) -> PackedSequence:
        """Sample `i` as ``seq_len + 1`` tokens with the starts of its document pieces.

        The same tokens as ``GPTSamples[i]``, gathered as one slice per document piece (a
        sample spans a few documents) in the stored dtype; the batch builder widens them.
        """
        samples = self.samples
        pieces = samples.document_boundaries(i)
        lengths = pieces.lengths
        begins = samples.document_starts[pieces.document_ids] + pieces.starts
        tokens = samples.tokens
        parts = [tokens[b : b + n] for b, n in zip(begins.tolist(), lengths.tolist()) if n]
        window = parts[0] if len(parts) == 1 else np.concatenate(parts)
        starts = np.cumsum(lengths) - lengths
        keep = (lengths > 0) & (starts < len(window))
        return PackedSequence(window, [int(s) for s in starts[keep]], len(window))

    def __getitem__(self, i: int) -> dict:
        """One sample as tensors: the streaming batch keys without the batch dimension."""
        batch = build_batch(
            [self.sequence(i)],
            mask_boundary_labels=self.mask_boundary_labels,
            labels_format=self.labels_format,
        )
        out = {k: (v[0] if k not in ("cu_seqlens", "max_seqlen") else v) for k, v in batch.items()}
        return to_tensors(out)

    def __getitems__(self, indices: list[int]) -> GatheredSamples:
        """The DataLoader's batched fetch: the samples' tokens gathered in one pass."""
        tokens, boundaries = self.samples.gather(indices)
        return GatheredSamples(tokens, boundaries, len(indices))

    def assemble(self, gathered: GatheredSamples, allocate: Allocator = allocate_arrays) -> dict:
        """The batch of `gathered` samples as numpy arrays from `allocate`."""
        return assemble_contiguous_batch(
            gathered.tokens,
            gathered.boundaries,
            gathered.rows,
            mask_boundary_labels=self.mask_boundary_labels,
            labels_format=self.labels_format,
            allocate=allocate,
        )

    def collate(self, gathered: GatheredSamples) -> dict:
        """The DataLoader collate_fn: a batch with the streaming dataset's keys."""
        if not isinstance(gathered, GatheredSamples):
            raise TypeError(
                "MemmapTokenDataset.collate takes what the DataLoader gets from __getitems__; "
                "pass collate_fn=dataset.collate with batch_size set"
            )
        ring = None
        if self.shared_memory and SlotRing.supported():
            if self._ring is None:
                self._ring = SlotRing(gathered.rows, self.seq_len)
            ring = self._ring
        batch = self.assemble(gathered, ring.allocate if ring is not None else allocate_arrays)
        if ring is None:
            return to_tensors(batch)
        return ring.package(batch, local=get_worker_info() is None)


class GatheredSamples(NamedTuple):
    """Samples end to end (``rows * (seq_len + 1)`` tokens) and where documents begin."""

    tokens: np.ndarray
    boundaries: list[int]
    rows: int
