"""Property tests: any documents round-trip identically through all three read paths."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtok.format import DatasetWriter, ShardReader, ShardStreamReader, load_manifest
from shardtok.format.megatron_io import iter_dataset_documents
from shardtok.storage import open_source

LIMITS = {np.dtype(np.uint16): 65500, np.dtype(np.int32): 2**31 - 1}


@st.composite
def corpora(draw):
    vocab_size = draw(st.sampled_from([2, 300, 65500, 65501, 2**31 - 1]))
    frame_size = draw(st.sampled_from([8, 64, 1024]))  # bytes: documents routinely exceed a frame
    lengths = draw(st.lists(st.sampled_from([0, 1, 2, 3, 17, 100, 700]), min_size=1, max_size=40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    docs = []
    for n in lengths:
        doc = rng.integers(0, vocab_size, size=n)
        if n >= 2:  # both ends of the id range
            doc[0], doc[-1] = 0, vocab_size - 1
        docs.append(doc)
    level = draw(st.sampled_from([None, 1, 3]))
    shard_size = draw(st.sampled_from([1, 200, 1 << 20]))
    return vocab_size, frame_size, level, shard_size, docs


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(corpus=corpora())
def test_all_read_paths_return_the_written_tokens(tmp_path_factory, corpus):
    vocab_size, frame_size, level, shard_size, docs = corpus
    folder = tmp_path_factory.mktemp("ds")
    with DatasetWriter(
        folder,
        vocab_size=vocab_size,
        frame_size=frame_size,
        compression_level=level,
        shard_size=shard_size,
    ) as w:
        for doc in docs:
            w.add(doc)
    manifest = load_manifest(folder)
    assert manifest.num_documents == len(docs)
    assert manifest.num_tokens == sum(len(d) for d in docs)

    random_access, streamed, mapped = [], [], []
    for entry in manifest.shards:
        reader = ShardReader(open_source(folder / entry.file))
        random_access += [reader.document(i) for i in reversed(range(len(reader)))][::-1]
        with open(folder / entry.file, "rb") as f:
            streamed += [d.copy() for d in ShardStreamReader(f, entry.file).documents()]
        if level is None:
            tokens = reader.memmap_tokens()
            mapped += [
                tokens[reader.offsets[i] : reader.offsets[i + 1]] for i in range(len(reader))
            ]
    sequential = list(iter_dataset_documents(folder))
    for path in (random_access, streamed, sequential) + ((mapped,) if level is None else ()):
        assert len(path) == len(docs)
        for got, want in zip(path, docs):
            assert got.dtype == manifest.dtype
            np.testing.assert_array_equal(got, want)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(corpus=corpora(), data=st.data())
def test_document_ranges_agree(tmp_path_factory, corpus, data):
    vocab_size, frame_size, level, _, docs = corpus
    folder = tmp_path_factory.mktemp("ds")
    with DatasetWriter(
        folder,
        vocab_size=vocab_size,
        frame_size=frame_size,
        compression_level=level,
        shard_size=1 << 30,
    ) as w:
        for doc in docs:
            w.add(doc)
    (entry,) = load_manifest(folder).shards
    start = data.draw(st.integers(0, len(docs)))
    stop = data.draw(st.integers(start, len(docs)))
    reader = ShardReader(open_source(folder / entry.file))
    with open(folder / entry.file, "rb") as f:
        streamed = list(ShardStreamReader(f, entry.file).documents(start, stop))
    ranged = list(reader.documents(start, stop))
    assert len(streamed) == len(ranged) == stop - start
    for a, b, want in zip(streamed, ranged, docs[start:stop]):
        np.testing.assert_array_equal(a, want)
        np.testing.assert_array_equal(b, want)
