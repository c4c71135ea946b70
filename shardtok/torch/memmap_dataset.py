"""The memmap path: a map-style Dataset with Megatron GPTDataset samples over local data.

For a Megatron ``.bin/.idx`` pair or a shardtok dataset written without compression. Sample
``i`` is exactly Megatron's (``GPTSamples``: document, sample and shuffle indices, separate
last epoch); it comes out with the same keys as the streaming batches (``source_ids`` all 0,
one source)::

    ds = MemmapTokenDataset("data/", seq_len=2048, num_samples=1_000_000, seed=1234)
    loader = DataLoader(ds, batch_size=8, collate_fn=ds.collate, num_workers=2,
                        sampler=DistributedSampler(ds))  # when data-parallel

``collate`` builds the batch in the worker (in shared memory, like the streaming dataset).

Loss masks are served when the data has them (a masked dataset's uncompressed shards, or a
Megatron prefix with the ``PREFIX_mask`` pair ``export-megatron --mask`` writes): labels are
-100 where the target is untrained and, always for such data, where it starts a document.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset, get_worker_info

from shardtok.memmap.samples import GPTSamples
from shardtok.memmap.tokens import open_local_data
from shardtok.stream.batch import BATCH_KEYS, allocate_arrays, build_batch, check_labels_format
from shardtok.stream.sequence import PackedSequence
from shardtok.torch.memmap_plan import BatchPlan
from shardtok.torch.model_inputs import model_batch, warn_if_transformers_mixes
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
        warn_if_transformers_mixes(labels_format)
        self.labels_format = labels_format
        self.shared_memory = shared_memory
        self._samples: GPTSamples | None = None
        self._ring: SlotRing | None = None
        self._length = len(self.samples)

    @property
    def samples(self) -> GPTSamples:
        if self._samples is None:  # opened per process: memmaps are not pickled to workers
            tokens, sizes, masks = open_local_data(self.path)
            samples = GPTSamples(
                tokens,  # type: ignore[arg-type]  # ConcatTokens indexes like an ndarray
                sizes,
                self.seq_len,
                self.num_samples,
                self.seed,
                cache_dir=self.cache_dir,
                masks=masks,  # type: ignore[arg-type]
            )
            self._samples = samples
        return self._samples

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_samples": None, "_ring": None}

    def __len__(self) -> int:
        return self._length

    @property
    def masked(self) -> bool:
        """Whether the data has loss masks (fine-tuning data)."""
        return self.samples.masks is not None

    def sequence(self, i: int) -> PackedSequence:
        """Sample `i` as ``seq_len + 1`` tokens with the starts of its document pieces.

        The same tokens as ``GPTSamples[i]``, gathered as one slice per document piece (a
        sample spans a few documents) in the stored dtype; the batch builder widens them.
        """
        samples = self.samples
        pieces = samples.document_boundaries(i)
        lengths = pieces.lengths
        begins = samples.document_starts[pieces.document_ids] + pieces.starts
        ranges = [(b, n) for b, n in zip(begins.tolist(), lengths.tolist()) if n]

        def cut(values):
            parts = [values[b : b + n] for b, n in ranges]
            return parts[0] if len(parts) == 1 else np.concatenate(parts)

        window = cut(samples.tokens)
        mask = None if samples.masks is None else samples.mask(i)
        starts = np.cumsum(lengths) - lengths
        keep = (lengths > 0) & (starts < len(window))
        return PackedSequence(window, [int(s) for s in starts[keep]], len(window), mask)

    def __getitem__(self, i: int) -> dict:
        """One sample as tensors: the streaming batch keys without the batch dimension."""
        batch = build_batch(
            [self.sequence(i)],
            mask_boundary_labels=self.mask_boundary_labels,
            labels_format=self.labels_format,
        )
        keep = ("cu_seqlens", "source_ids")  # source_ids: a 0-d array, still a tensor
        out = {k: (v[0] if k in BATCH_KEYS and k not in keep else v) for k, v in batch.items()}
        out["source_ids"] = batch["source_ids"].reshape(())
        return to_tensors(out)

    def __getitems__(self, indices: list[int]) -> BatchPlan:
        """The DataLoader's batched fetch: the batch of samples `indices`, planned."""
        return self.plan(indices, [len(indices)])

    def plan(self, indices: Sequence[int] | np.ndarray, sizes: Sequence[int]) -> BatchPlan:
        """Batches of `indices` cut into `sizes`, planned together (``memmap_plan``)."""
        return BatchPlan(
            self.samples,
            indices,
            sizes,
            mask_boundary_labels=self.mask_boundary_labels,
            labels_format=self.labels_format,
        )

    def collate(self, planned: BatchPlan) -> dict:
        """The DataLoader collate_fn: a batch with the streaming dataset's keys."""
        if not isinstance(planned, BatchPlan) or len(planned) != 1:
            raise TypeError(
                "MemmapTokenDataset.collate takes what the DataLoader gets from __getitems__; "
                "pass collate_fn=dataset.collate with batch_size set"
            )
        ring = None
        if self.shared_memory and SlotRing.supported():
            if self._ring is None:
                self._ring = SlotRing(planned.sizes[0], self.seq_len)
            ring = self._ring
        batch = planned.batch(0, ring.allocate if ring is not None else allocate_arrays)
        if ring is None:
            return model_batch(to_tensors(batch), self.labels_format)
        return ring.package(
            batch, labels_format=self.labels_format, local=get_worker_info() is None
        )
