"""megatron-core 0.16.1: a `.bin/.idx` pair written by its IndexedDatasetBuilder (as
tools/preprocess_data.py does), read by `GPTDataset` built through BlendedMegatronDatasetBuilder
(one epoch of samples; document, sample and shuffle indices cached on disk), and batched by a
torch DataLoader over the already-shuffled sample order (what Megatron's pretraining sampler does).

`create_attention_mask=False`: with the default a [1, seq_len, seq_len] bool mask (4 MiB at
2048) is built per sample; flash and varlen attention kernels do not need it, and no other
system here builds one.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

from shardtok.format import MegatronPair  # noqa: E402

logging.getLogger("megatron").setLevel(logging.WARNING)

LABEL = "Megatron GPTDataset"
LAYOUT = ".bin/.idx pair (IndexedDatasetBuilder); GPTDataset (shuffled sample index, cached); DataLoader(batch_size=8)"


def write(source, out: Path, options) -> None:
    pair = MegatronPair(source.prefix)
    out.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(str(out / "tokens.bin"), dtype=np.dtype(source.dtype).type)
    for i in range(len(pair)):
        doc = np.asarray(pair[i])
        builder.add_document(doc, [len(doc)])
    builder.finalize(str(out / "tokens.idx"))


def _dataset(out: Path, source, options) -> GPTDataset:
    config = GPTDatasetConfig(
        random_seed=options.seed,
        sequence_length=options.seq_len,
        blend=([str(out / "tokens")], None),
        split="100,0,0",
        # NullTokenizer(v) has v + 1 ids and its EOD is v: here the data's vocabulary and EOS
        tokenizer=NullTokenizer(source.vocab_size - 1),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        path_to_cache=str(out / "cache"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train, _, _ = BlendedMegatronDatasetBuilder(
            GPTDataset, [None, None, None], lambda: True, config
        ).build()
    return train


def prepare(out: Path, source, options) -> None:
    _dataset(out, source, options)


def loader(out: Path, source, options):
    return torch.utils.data.DataLoader(
        _dataset(out, source, options),
        batch_size=options.batch_size,
        shuffle=False,
        num_workers=options.num_workers,
        drop_last=True,
    )


def training_inputs(batch):
    return batch["tokens"], batch["labels"], batch["position_ids"]
