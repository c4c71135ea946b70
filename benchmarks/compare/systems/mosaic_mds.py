"""MosaicML Streaming 0.13: MDS shards with one document per sample (`tokens`: ndarray of the source
dtype), read by `StreamingDataset(shuffle=True)` and packed by a small IterableDataset wrapper.

`import streaming` runs streaming/__init__.py, which imports streaming.vision and with it
torchvision, whose PyPI wheels are CUDA builds that cannot load against CPU torch. The MDS
writer and StreamingDataset live in streaming.base, which needs none of that, so the package
object is created from its spec without executing its __init__, and streaming.base is imported
normally beneath it. DataLoader workers are forked and inherit that module table.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks.compare.packing import pack_batches
from benchmarks.compare.systems import arange_positions
from shardtok.format import MegatronPair

LABEL = "MosaicML Streaming"
LAYOUT = "MDS shards, one document per sample (ndarray column); StreamingDataset(shuffle=True, py1e) + packing wrapper"


def _streaming_base():
    if "streaming" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        if spec is None:
            raise ImportError("mosaicml-streaming is not installed")
        sys.modules["streaming"] = importlib.util.module_from_spec(spec)
    return importlib.import_module("streaming.base")


base = _streaming_base()


def write(source, out: Path, options) -> None:
    pair = MegatronPair(source.prefix)
    columns = {"tokens": f"ndarray:{np.dtype(source.dtype).name}"}
    with base.MDSWriter(
        out=str(out), columns=columns, compression=None, size_limit=options.shard_bytes
    ) as writer:
        for i in range(len(pair)):
            writer.write({"tokens": np.asarray(pair[i])})


class PackedStreamingDataset(torch.utils.data.IterableDataset):
    """Documents from a StreamingDataset, packed into batches inside the DataLoader worker."""

    def __init__(self, dataset, seq_len: int, batch_size: int):
        self.dataset = dataset
        self.seq_len = seq_len
        self.batch_size = batch_size

    def __iter__(self):
        docs = (sample["tokens"] for sample in self.dataset)
        return pack_batches(docs, self.seq_len, self.batch_size)


def loader(out: Path, source, options):
    importlib.import_module("streaming.base.util").clean_stale_shared_memory()
    # batch_size: samples per device batch, which StreamingDataset partitions by; the packer
    # consumes documents, so the nearest equivalent is the number of sequences per batch
    dataset = base.StreamingDataset(
        local=str(out), shuffle=True, shuffle_seed=options.seed, batch_size=options.batch_size
    )
    packed = PackedStreamingDataset(dataset, options.seq_len, options.batch_size)
    return torch.utils.data.DataLoader(packed, batch_size=None, num_workers=options.num_workers)


def training_inputs(batch):
    ids = batch["input_ids"]
    return ids, batch["labels"], arange_positions(*ids.shape)
