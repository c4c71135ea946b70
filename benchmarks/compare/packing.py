"""Concat packing for the document-per-sample formats (WebDataset, MosaicML Streaming).

Documents (each ending with its EOS) are joined and cut into windows of seq_len + 1 tokens, the
packing LitData's TokensLoader, Megatron's GPTDataset and shardtok's `concat` do; a batch is cut
with one concatenate and one int64 conversion, so the wrapper costs a copy per token, not a
Python step per token.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch


def pack_batches(
    documents: Iterable[np.ndarray], seq_len: int, batch_size: int
) -> Iterator[dict[str, torch.Tensor]]:
    need = batch_size * (seq_len + 1)
    pending: list[np.ndarray] = []
    have = 0
    for doc in documents:
        pending.append(doc)
        have += len(doc)
        if have < need:
            continue
        flat = np.concatenate(pending)
        while flat.size >= need:
            window = torch.from_numpy(flat[:need].astype(np.int64)).view(batch_size, seq_len + 1)
            yield {"input_ids": window[:, :-1], "labels": window[:, 1:]}
            flat = flat[need:]
        pending, have = ([flat] if flat.size else []), flat.size
