"""WebDataset 1.0.2: tar shards with one document per sample (`KEY.tokens.npy`), packed in the pipeline.

Why this layout is fair: it stores what shardtok stores (whole documents, in the source dtype),
so the sequence length, packing and document shuffling stay choices made at read time, as with
shardtok; storing pre-cut windows would fix seq_len at write time and skip the packing work the
other document formats do. The pipeline is the one WebDataset documents: shard shuffle after the
worker split, a 1000-sample shuffle buffer, `.decode()` (numpy's .npy reader), and a packing
stage composed into the pipeline, so batches are built inside the workers
(`WebLoader(batch_size=None)`).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import webdataset as wds

from benchmarks.compare.packing import pack_batches
from benchmarks.compare.systems import arange_positions
from shardtok.format import MegatronPair

LABEL = "WebDataset"
LAYOUT = "tar shards, one document per sample as .npy; shard shuffle + 1000-sample buffer; packing stage in the pipeline"


def write(source, out: Path, options) -> None:
    pair = MegatronPair(source.prefix)
    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(
        str(out / "shard-%06d.tar"), maxcount=1 << 40, maxsize=options.shard_bytes, verbose=0
    ) as sink:
        for i in range(len(pair)):
            sink.write({"__key__": f"{i:010d}", "tokens.npy": np.asarray(pair[i])})


def _pack(samples, seq_len: int, batch_size: int):
    return pack_batches((tokens for (tokens,) in samples), seq_len, batch_size)


def loader(out: Path, source, options):
    urls = sorted(str(p) for p in Path(out).glob("shard-*.tar"))
    dataset = (
        wds.WebDataset(
            urls,
            shardshuffle=len(urls),
            nodesplitter=wds.split_by_node,
            workersplitter=wds.split_by_worker,
            seed=options.seed,
            empty_check=False,
        )
        .shuffle(options.shuffle_buffer, seed=options.seed)
        .decode()
        .to_tuple("tokens.npy")
        .compose(partial(_pack, seq_len=options.seq_len, batch_size=options.batch_size))
    )
    return wds.WebLoader(dataset, batch_size=None, num_workers=options.num_workers)


def training_inputs(batch):
    ids = batch["input_ids"]
    return ids, batch["labels"], arange_positions(*ids.shape)
