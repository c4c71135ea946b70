"""GPTSamples returns, for every index, the tokens megatron-core's GPTDataset returns."""

from __future__ import annotations

import numpy as np
import pytest

from shardtok.memmap.samples import GPTSamples
from tests.helpers.index_data import (
    megatron_gpt_dataset,
    megatron_sample,
    random_sizes,
    write_megatron_pair,
)

SEQ_LENGTH = 24


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    # Short documents (mean ~15 tokens) so most samples span several, some span empty ones.
    sizes = random_sizes(seed=3, num_documents=300, max_len=30)
    tokens = write_megatron_pair(folder / "pair", sizes, seed=4)
    return folder / "pair", sizes, tokens


def _epoch_samples(sizes, documents):
    return (int(sizes[documents].sum()) - 1) // SEQ_LENGTH


@pytest.mark.parametrize(
    ("seed", "span", "wanted"),
    [
        (1, (0, 300), lambda spe: None),
        (2, (0, 300), lambda spe: spe // 2),
        (3, (0, 300), lambda spe: 2 * spe + spe // 10),  # separate final epoch
        (4, (50, 250), lambda spe: 3 * spe + (9 * spe) // 10),  # shuffled with the others
    ],
)
def test_every_sample_equals_megatron(corpus, tmp_path, seed, span, wanted):
    prefix, sizes, tokens = corpus
    documents = np.arange(*span, dtype=np.int32)
    num_samples = wanted(_epoch_samples(sizes, documents))
    reference = megatron_gpt_dataset(prefix, tmp_path, SEQ_LENGTH, num_samples, seed, documents)
    samples = GPTSamples(tokens, sizes, SEQ_LENGTH, num_samples, seed, documents)
    assert len(samples) == len(reference)
    for i in range(len(samples)):
        expected_tokens, expected_documents = megatron_sample(reference, i)
        got = samples[i]
        assert got.dtype == np.int64 and got.shape == (SEQ_LENGTH + 1,)
        np.testing.assert_array_equal(got, expected_tokens, err_msg=f"sample {i}")
        boundaries = samples.document_boundaries(i)
        np.testing.assert_array_equal(boundaries.document_ids, expected_documents)


def test_document_boundaries_describe_the_sample(corpus):
    _, sizes, tokens = corpus
    samples = GPTSamples(tokens, sizes, SEQ_LENGTH, num_samples=200, seed=7)
    starts = np.cumsum(sizes, dtype=np.int64) - sizes
    spanning = 0
    for i in range(len(samples)):
        pieces = samples.document_boundaries(i)
        assert pieces.lengths.sum() == SEQ_LENGTH + 1
        assert (pieces.starts[1:] == 0).all()  # only the first piece can start mid-document
        # Every piece, the last one's extra label token included, lies inside its document.
        assert (pieces.starts + pieces.lengths <= sizes[pieces.document_ids]).all()
        rebuilt = np.concatenate(
            [
                tokens[starts[d] + s : starts[d] + s + n]
                for d, s, n in zip(pieces.document_ids, pieces.starts, pieces.lengths, strict=True)
            ]
        )
        np.testing.assert_array_equal(rebuilt, samples[i])
        spanning += pieces.document_ids.shape[0] > 1
    assert spanning > len(samples) // 2  # the corpus really exercises multi-document samples


def test_memmap_tokens_and_cache_give_the_same_samples(corpus, tmp_path):
    prefix, sizes, tokens = corpus
    on_disk = np.memmap(f"{prefix}.bin", dtype=np.uint16, mode="r")
    in_memory = GPTSamples(tokens, sizes, SEQ_LENGTH, num_samples=150, seed=9)
    mapped = GPTSamples(on_disk, sizes, SEQ_LENGTH, num_samples=150, seed=9, cache_dir=tmp_path)
    reloaded = GPTSamples(on_disk, sizes, SEQ_LENGTH, num_samples=150, seed=9, cache_dir=tmp_path)
    # Loaded from the cache: plain ndarray views over the cache's memory-mapped pages.
    assert isinstance(reloaded.indices.sample_index.base.base, np.memmap)
    assert len(in_memory) == len(mapped) == len(reloaded)
    for i in range(len(in_memory)):
        np.testing.assert_array_equal(mapped[i], in_memory[i])
        np.testing.assert_array_equal(reloaded[i], in_memory[i])


def test_negative_and_out_of_range_indices(corpus):
    _, sizes, tokens = corpus
    samples = GPTSamples(tokens, sizes, SEQ_LENGTH, seed=1)
    np.testing.assert_array_equal(samples[-1], samples[len(samples) - 1])
    with pytest.raises(IndexError, match="out of range"):
        samples[len(samples)]
    with pytest.raises(IndexError):
        samples[-len(samples) - 1]
    with pytest.raises(TypeError):
        samples[1.0]


def test_sizes_must_describe_the_tokens(corpus):
    _, sizes, tokens = corpus
    with pytest.raises(ValueError, match="add up to"):
        GPTSamples(tokens[:-1], sizes, SEQ_LENGTH)
    with pytest.raises(ValueError, match="1-D"):
        GPTSamples(tokens.reshape(1, -1), sizes, SEQ_LENGTH)
    with pytest.raises(ValueError, match="negative"):
        GPTSamples(tokens, np.array([-1, int(sizes.sum()) + 1]), SEQ_LENGTH)
