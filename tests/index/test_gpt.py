"""shardtok.index.gpt and .cache against the reference note and megatron-core 0.16.1 itself."""

from __future__ import annotations

import os
import warnings
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.index import build_gpt_indices, build_sample_idx, cached_gpt_indices
from shardtok.index import cache as cache_module
from shardtok.index import gpt as gpt_module
from shardtok.index.cache import gpt_indices_cache_key
from shardtok.index.gpt import build_document_index, build_shuffle_index
from tests.helpers.index_data import megatron_gpt_dataset, random_sizes, write_megatron_pair

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets import gpt_dataset as megatron_gpt
    from megatron.core.datasets import helpers_cpp
    from megatron.core.datasets.utils import Split

SEQ_LENGTH = 32


def test_reference_note_sample_idx():
    sizes = np.array([20, 50, 60, 30, 100, 5], dtype=np.int32)
    sample_idx = build_sample_idx(sizes, np.arange(6, dtype=np.int32), 30, 1, int(sizes.sum()))
    expected = [[0, 0], [1, 10], [1, 40], [2, 20], [2, 50], [3, 20], [4, 20], [4, 50], [4, 80]]
    assert sample_idx.dtype == np.int32
    assert sample_idx.tolist() == expected


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 80), min_size=1, max_size=40),
    num_epochs=st.integers(1, 3),
    seq_length=st.integers(2, 50),
    drop_last=st.booleans(),
    extra=st.booleans(),
    shuffle_seed=st.integers(0, 2**32 - 1),
    block=st.sampled_from([1, 3, 1 << 23]),
)
def test_sample_idx_equals_megatron_cpp(
    sizes, num_epochs, seq_length, drop_last, extra, shuffle_seed, block
):
    sizes = np.array(sizes, dtype=np.int32)
    tokens_per_epoch = int(sizes.sum())
    if tokens_per_epoch < 2:
        return
    doc_idx = np.tile(np.arange(sizes.size, dtype=np.int32), num_epochs)
    np.random.RandomState(shuffle_seed).shuffle(doc_idx)
    args = (sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch, drop_last)
    # Both C++ instantiations megatron picks between (int32 / int64 rows) give the same values.
    reference32 = helpers_cpp.build_sample_idx_int32(*args, int(extra))
    reference64 = helpers_cpp.build_sample_idx_int64(*args, int(extra))
    np.testing.assert_array_equal(reference32, reference64)
    with mock.patch.object(gpt_module, "_DOCUMENT_BLOCK", block):
        if (reference32 < 0).any():
            # The C++ leaves offset -1 when the last document is empty; we refuse instead.
            with pytest.raises(ValueError, match="empty"):
                build_sample_idx(*args, extra)
            return
        ours = build_sample_idx(*args, extra)
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, reference32)


def test_sample_idx_keeps_megatrons_float32_sample_count():
    # ceil(float32(2**24 + 1) / 2) is 2**23 in single precision but 2**23 + 1 exactly; the C++
    # counts in float32, so one fewer sample than exact arithmetic would give.
    sizes = np.array([2**24 + 2], dtype=np.int32)
    doc_idx = np.zeros(1, dtype=np.int32)
    ours = build_sample_idx(sizes, doc_idx, 2, 1, 2**24 + 2, False, True)
    reference = helpers_cpp.build_sample_idx_int32(sizes, doc_idx, 2, 1, 2**24 + 2, False, 1)
    assert ours.shape == reference.shape == (2**23 + 1, 2)
    np.testing.assert_array_equal(ours, reference)


def test_sample_idx_switches_to_int64_like_megatron():
    # Megatron's wrapper: int64 rows once max(len(doc_idx), sizes.max()) exceeds int32.
    sizes = np.array([2**31 + 5], dtype=np.int64)
    ours = build_sample_idx(sizes, np.zeros(1, dtype=np.int32), 2**30, 1, 2**31 + 5)
    assert ours.dtype == np.int64
    assert ours.tolist() == [[0, 0], [0, 2**30], [0, 2**31]]


@pytest.mark.parametrize("bad", [{"seq_length": 1}, {"num_epochs": 0}, {"tokens_per_epoch": 1}])
def test_sample_idx_rejects_impossible_arguments(bad):
    arguments = {"seq_length": 4, "num_epochs": 1, "tokens_per_epoch": 10} | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        build_sample_idx(np.array([10]), np.array([0]), **arguments)


@pytest.mark.parametrize(("num_epochs", "separate"), [(1, False), (3, False), (3, True)])
def test_document_index_equals_megatron(num_epochs, separate):
    documents = np.arange(5, 60, dtype=np.int32)
    ours = build_document_index(documents, num_epochs, np.random.RandomState(7), separate)
    reference = megatron_gpt._build_document_index(
        documents, num_epochs, np.random.RandomState(7), separate
    )
    assert ours.dtype == reference.dtype == np.int32
    np.testing.assert_array_equal(ours, reference)
    if separate:  # the final epoch is a permutation of the documents on its own
        assert sorted(ours[-documents.size :].tolist()) == documents.tolist()


@pytest.mark.parametrize(("num_samples", "total"), [(50, 50), (40, 57), (0, 9)])
def test_shuffle_index_equals_megatron(num_samples, total):
    ours = build_shuffle_index(num_samples, total, np.random.RandomState(3))
    reference = megatron_gpt._build_shuffle_index(num_samples, total, np.random.RandomState(3))
    assert ours.dtype == reference.dtype == np.uint32
    np.testing.assert_array_equal(ours, reference)
    assert sorted(ours[num_samples:].tolist()) == list(range(num_samples, total))


@pytest.fixture(scope="module")
def megatron_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pair")
    sizes = random_sizes(seed=11, num_documents=400)
    tokens = write_megatron_pair(folder / "corpus", sizes)
    return folder / "corpus", sizes, tokens


def _samples_per_epoch(sizes, documents):
    return (int(sizes[documents].sum()) - 1) // SEQ_LENGTH


# (seed, documents range, num_samples as a function of samples per epoch, final epoch separate?)
GPT_CASES = [
    (1, (0, 400), lambda spe: None, False),
    (2, (0, 400), lambda spe: spe // 3, False),
    (3, (0, 400), lambda spe: 3 * spe + spe // 10, True),
    (4, (0, 400), lambda spe: 2 * spe + (9 * spe) // 10, False),
    (6, (0, 400), lambda spe: 2 * spe + (65 * spe) // 100, True),
    (5, (40, 300), lambda spe: 4 * spe + 3, True),
    (1234, (100, 400), lambda spe: spe, False),
]


@pytest.mark.parametrize(("seed", "span", "wanted", "separate"), GPT_CASES)
def test_gpt_indices_equal_megatron_gpt_dataset(
    megatron_pair, tmp_path, seed, span, wanted, separate
):
    prefix, sizes, _ = megatron_pair
    documents = np.arange(*span, dtype=np.int32)
    num_samples = wanted(_samples_per_epoch(sizes, documents))
    reference = megatron_gpt_dataset(prefix, tmp_path, SEQ_LENGTH, num_samples, seed, documents)
    ours = build_gpt_indices(sizes, SEQ_LENGTH, num_samples, seed, documents)
    for name in ("document_index", "sample_index", "shuffle_index"):
        expected = getattr(reference, name)
        actual = getattr(ours, name)
        assert actual.dtype == expected.dtype, name
        np.testing.assert_array_equal(actual, expected, err_msg=name)
    if num_samples is not None:
        assert len(reference) >= num_samples
    # The case list really covers both sides of Megatron's separate-final-epoch rule.
    tokens_per_epoch = int(sizes[documents].sum())
    epochs = gpt_module.num_epochs_for(tokens_per_epoch, SEQ_LENGTH, num_samples)
    is_separate = (
        epochs > 1
        and gpt_module._separate_final_epoch(tokens_per_epoch, SEQ_LENGTH, num_samples, epochs, 1)[
            0
        ]
    )
    assert is_separate == separate


def test_gpt_indices_equal_megatron_validation_split_with_partial_sample(megatron_pair, tmp_path):
    prefix, sizes, _ = megatron_pair
    documents = np.arange(300, 400, dtype=np.int32)
    reference = megatron_gpt_dataset(
        prefix,
        tmp_path,
        SEQ_LENGTH,
        None,
        9,
        documents,
        Split.valid,
        drop_last_partial_validation_sequence=False,
    )
    ours = build_gpt_indices(
        sizes, SEQ_LENGTH, None, 9, documents, drop_last_partial_sequence=False
    )
    for name in ("document_index", "sample_index", "shuffle_index"):
        np.testing.assert_array_equal(getattr(ours, name), getattr(reference, name), name)


def test_gpt_indices_reject_empty_inputs():
    with pytest.raises(ValueError, match="at least one document"):
        build_gpt_indices(np.array([5, 5]), 4, None, 0, documents=np.array([], dtype=np.int32))
    with pytest.raises(ValueError, match="too few"):
        build_gpt_indices(np.array([1, 0]), 4, None, 0)


CACHE_INPUTS = {
    "sizes": np.array([30, 0, 45, 12, 80, 7, 66], dtype=np.int32),
    "seq_length": 16,
    "num_samples": 40,
    "seed": 5,
    "documents": np.arange(1, 7),
    "add_extra_token_to_sequence": True,
    "drop_last_partial_sequence": True,
}


def test_cache_second_call_loads_instead_of_rebuilding(tmp_path):
    first = cached_gpt_indices(tmp_path, **CACHE_INPUTS)
    built = build_gpt_indices(**CACHE_INPUTS)
    folders = os.listdir(tmp_path)
    assert folders == [f"gpt-{gpt_indices_cache_key(**CACHE_INPUTS)}"]  # no staging left over

    def refuse(*args, **kwargs):
        raise AssertionError("the cache was rebuilt")

    with mock.patch.object(cache_module, "build_gpt_indices", refuse):
        second = cached_gpt_indices(tmp_path, **CACHE_INPUTS)
    for loaded_first, loaded_second, fresh in zip(first, second, built, strict=True):
        assert isinstance(loaded_second, np.memmap) and not loaded_second.flags.writeable
        assert loaded_second.dtype == fresh.dtype
        np.testing.assert_array_equal(loaded_first, fresh)
        np.testing.assert_array_equal(loaded_second, fresh)


@pytest.mark.parametrize(
    "change",
    [
        {"sizes": np.array([30, 0, 45, 12, 80, 7, 67], dtype=np.int32)},
        {"sizes": np.array([30, 0, 45, 12, 80, 7, 66, 1], dtype=np.int32)},
        {"seq_length": 17},
        {"num_samples": 41},
        {"num_samples": None},
        {"seed": 6},
        {"documents": np.arange(1, 6)},
        {"documents": None},
        {"add_extra_token_to_sequence": False},
        {"drop_last_partial_sequence": False},
    ],
)
def test_cache_key_changes_with_every_input(change):
    assert gpt_indices_cache_key(**(CACHE_INPUTS | change)) != gpt_indices_cache_key(**CACHE_INPUTS)


def test_cache_key_ignores_how_arrays_are_stored():
    same = CACHE_INPUTS | {
        "sizes": CACHE_INPUTS["sizes"].astype(np.int64),
        "documents": list(range(1, 7)),
    }
    assert gpt_indices_cache_key(**same) == gpt_indices_cache_key(**CACHE_INPUTS)


def test_cache_publish_race_keeps_the_first_copy(tmp_path):
    indices = cached_gpt_indices(tmp_path, **CACHE_INPUTS)
    folder = tmp_path / f"gpt-{gpt_indices_cache_key(**CACHE_INPUTS)}"
    before = (folder / "sample_index.npy").stat().st_mtime_ns
    # A second process that built the same arrays publishes after the first: its rename fails
    # because the folder exists, and it must quietly discard its staging copy.
    cache_module._publish(tmp_path, folder, build_gpt_indices(**CACHE_INPUTS), {})
    assert os.listdir(tmp_path) == [folder.name]
    assert (folder / "sample_index.npy").stat().st_mtime_ns == before
    np.testing.assert_array_equal(cached_gpt_indices(tmp_path, **CACHE_INPUTS)[1], indices[1])


def test_cache_damaged_file_is_rebuilt_with_a_warning_not_used(tmp_path, caplog):
    expected = build_gpt_indices(**CACHE_INPUTS)
    cached_gpt_indices(tmp_path, **CACHE_INPUTS)
    damaged = tmp_path / f"gpt-{gpt_indices_cache_key(**CACHE_INPUTS)}" / "sample_index.npy"
    damaged.write_bytes(damaged.read_bytes()[:-40])
    rebuilt = cached_gpt_indices(tmp_path, **CACHE_INPUTS)
    (record,) = [r for r in caplog.records if r.name == "shardtok.index.cache"]
    assert record.levelname == "WARNING" and "sample_index.npy" in record.getMessage()
    for got, want in zip(rebuilt, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert os.listdir(tmp_path) == [damaged.parent.name]
