"""Both stages under a PyTorch DataLoader with two workers: every document exactly once."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import webdataset as wds

import shardtok.webdataset as sw
from tests.webdataset.conftest import native_documents, shard_paths

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("stage", ["documents", "stream_documents"])
def test_two_workers_serve_every_document_once(sft_dataset, stage):
    urls = shard_paths(sft_dataset)
    if stage == "documents":
        pipeline = wds.WebDataset(urls, shardshuffle=False).compose(sw.documents())
    else:
        pipeline = wds.DataPipeline(
            wds.SimpleShardList(urls), wds.split_by_worker, sw.stream_documents()
        )
    loader = torch.utils.data.DataLoader(pipeline, num_workers=2, batch_size=None)
    samples = list(loader)
    expected = {d.key: d for d in native_documents(sft_dataset)}
    assert Counter(s["__key__"] for s in samples) == Counter(expected.keys())
    assert {s["__url__"] for s in samples} == set(urls)
    for sample in samples:
        doc = expected[sample["__key__"]]
        assert np.array_equal(sample["tokens"].numpy(), doc.tokens)
        assert np.array_equal(sample["mask"].numpy(), doc.mask)
