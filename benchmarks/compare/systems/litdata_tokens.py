"""LitData 0.2.76, its documented LLM-pretraining path: `optimize(..., item_loader=TokensLoader())`
writes the documents end to end into token chunks (a multiple of seq_len + 1 tokens each, as the
docs' `chunk_size=(2049 * 8012)`), and `StreamingDataset(item_loader=TokensLoader(block_size=
seq_len + 1), shuffle=True)` serves blocks that `StreamingDataLoader(batch_size=8)` stacks.

The blocks keep the stored dtype; the training loop cuts inputs and targets and turns both into
int64 (`.long()`, as LitGPT's loop does), which `training_inputs` does here in the main process,
inside the timed loop.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import numpy as np

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")

import litdata  # noqa: E402
import torch  # noqa: E402

from benchmarks.compare.systems import arange_positions  # noqa: E402
from shardtok.format import MegatronPair  # noqa: E402

LABEL = "LitData"
LAYOUT = "optimize() token chunks (TokensLoader); StreamingDataset(shuffle=True) blocks of seq_len+1; StreamingDataLoader(batch_size=8)"

_PAIRS: dict[str, MegatronPair] = {}


def _documents(span: tuple[int, int], prefix: str):
    pair = _PAIRS.get(prefix) or _PAIRS.setdefault(prefix, MegatronPair(prefix))
    for i in range(*span):
        yield torch.from_numpy(np.array(pair[i]))


def write(source, out: Path, options) -> None:
    num_docs = source.num_documents
    step = max(1, -(-num_docs // 64))
    spans = [(i, min(i + step, num_docs)) for i in range(0, num_docs, step)]
    itemsize = np.dtype(source.dtype).itemsize
    block = options.seq_len + 1
    litdata.optimize(
        fn=partial(_documents, prefix=source.prefix),
        inputs=spans,
        output_dir=str(out),
        chunk_size=block * max(1, options.shard_bytes // (itemsize * block)),
        item_loader=litdata.TokensLoader(),
        num_workers=1,
        mode="overwrite",
        verbose=False,
    )


def loader(out: Path, source, options):
    dataset = litdata.StreamingDataset(
        input_dir=str(out),
        item_loader=litdata.TokensLoader(block_size=options.seq_len + 1),
        shuffle=True,
        drop_last=True,
        seed=options.seed,
    )
    return litdata.StreamingDataLoader(
        dataset, batch_size=options.batch_size, num_workers=options.num_workers
    )


def training_inputs(batch):
    return (
        batch[:, :-1].long(),
        batch[:, 1:].long(),
        arange_positions(batch.shape[0], batch.shape[1] - 1),
    )
