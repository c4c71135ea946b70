"""``labels_format``: shifted labels, and Hugging Face's (aligned with input_ids, shifted by the
model), checked against a real transformers causal LM and DataCollatorWithFlattening."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.cli.main import run as main
from shardtok.errors import ResumeStateError, UsageError
from shardtok.format import write_megatron_pair
from shardtok.stream.batch import IGNORE_INDEX, assemble_batch, to_hf_labels
from shardtok.stream.nodes.array_documents import ArrayDocuments
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.nodes.concat import ConcatPacker
from shardtok.stream.nodes.greedy import GreedyPacker
from shardtok.stream.options import StreamOptions
from shardtok.stream.resume.fingerprint import fingerprint_differences
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import ShardLoader, ShardStreamDataset
from shardtok.torch.memmap_dataset import MemmapTokenDataset
from tests.helpers.tiny_lm import tiny_causal_lm as tiny_lm

transformers = pytest.importorskip("transformers")

VOCAB = 97
PACKERS = {
    "concat": lambda docs, seq_len: ConcatPacker(ArrayDocuments(docs), seq_len),
    "greedy": lambda docs, seq_len: GreedyPacker(ArrayDocuments(docs), seq_len, lookahead=3),
}


def documents(seed: int = 0, count: int = 40) -> list[np.ndarray]:
    """Random documents of ids in [1, VOCAB): never the padding id 0, so padding is visible."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, size=int(n), dtype=np.int32) for n in rng.integers(2, 30, count)]


def first_batch(packing: str, mask: bool, labels_format: str, batch_size=3) -> dict:
    seq_len = 24 if packing == "concat" else 45  # greedy: rows end in padding
    batcher = Batcher(PACKERS[packing](documents(), seq_len), batch_size,
                      mask_boundary_labels=mask, labels_format=labels_format)  # fmt: skip
    return next(iter(batcher))


def test_worked_example():
    # Two documents in one window of seq_len + 1 = 7 tokens (the example in docs/STREAMING.md).
    tokens = np.array([[10, 11, 12, 20, 21, 22, 23]])
    shifted = assemble_batch(tokens, [[0, 3]], [7], mask_boundary_labels=True)
    hf = assemble_batch(tokens, [[0, 3]], [7], mask_boundary_labels=True, labels_format="hf")
    assert shifted["input_ids"].tolist() == hf["input_ids"].tolist() == [[10, 11, 12, 20, 21, 22]]
    assert shifted["labels"].tolist() == [[11, 12, -100, 21, 22, 23]]
    assert hf["labels"].tolist() == [[-100, 11, 12, -100, 21, 22]]  # 23 cannot be expressed
    for key in ("position_ids", "document_ids", "cu_seqlens"):
        assert np.array_equal(shifted[key], hf[key])


@pytest.mark.parametrize("packing", ["concat", "greedy"])
@pytest.mark.parametrize("mask", [False, True])
def test_hf_is_the_shifted_labels_moved_right(packing, mask):
    shifted = first_batch(packing, mask, "shifted")
    hf = first_batch(packing, mask, "hf")
    assert np.array_equal(hf["labels"], to_hf_labels(shifted["labels"].copy()))
    trained = hf["labels"] != IGNORE_INDEX
    # Aligned: every trained hf label is the input token at its own position.
    assert np.array_equal(hf["labels"][trained], hf["input_ids"][trained])
    for key in ("input_ids", "position_ids", "document_ids", "cu_seqlens", "max_seqlen"):
        assert np.array_equal(shifted[key], hf[key]), key


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=30),
    seq_len=st.integers(1, 12),
    batch_size=st.integers(1, 4),
    packing=st.sampled_from(["concat", "greedy"]),
    mask=st.booleans(),
)
def test_hf_batches_are_shifted_batches_moved_right(lengths, seq_len, batch_size, packing, mask):
    # concat takes the whole-batch path, greedy the row path: both build hf labels directly.
    docs = [np.arange(n, dtype=np.int32) + 1000 * k for k, n in enumerate(lengths)]

    def batches(labels_format):
        return Batcher(PACKERS[packing](docs, seq_len), batch_size,
                       mask_boundary_labels=mask, labels_format=labels_format)  # fmt: skip

    for shifted, hf in zip(batches("shifted"), batches("hf"), strict=True):
        assert np.array_equal(hf["labels"], to_hf_labels(shifted["labels"].copy()))
        assert np.array_equal(hf["input_ids"], shifted["input_ids"])


def tiny_causal_lm():
    return tiny_lm(VOCAB)


@pytest.mark.parametrize("packing", ["concat", "greedy"])
@pytest.mark.parametrize("mask", [False, True])
def test_transformers_loss_on_hf_labels_is_the_cross_entropy_of_the_trained_targets(packing, mask):
    model = tiny_causal_lm()
    shifted = first_batch(packing, mask, "shifted")
    hf = first_batch(packing, mask, "hf")
    if packing == "greedy":
        assert (shifted["input_ids"] == 0).any()  # the case covers padding
    inputs = {k: torch.from_numpy(hf[k]) for k in ("input_ids", "position_ids")}
    with torch.no_grad():
        out = model(**inputs, labels=torch.from_numpy(hf["labels"]))
        wrong = model(**inputs, labels=torch.from_numpy(shifted["labels"])).loss
    # By hand, from the same logits: cross-entropy of input i against its shifted target, over
    # the trained targets except each row's last (which hf labels cannot carry).
    targets = torch.from_numpy(shifted["labels"]).clone()
    targets[:, -1] = IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(
        out.logits.float().reshape(-1, VOCAB), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )
    torch.testing.assert_close(out.loss, expected)
    assert (targets != IGNORE_INDEX).sum() == (hf["labels"] != IGNORE_INDEX).sum()
    assert not torch.isclose(wrong, expected)  # shifted labels fed to the model: shifted twice


def flatten_like_hf(batch: dict) -> tuple[list[dict], dict]:
    """The batch's documents (padding left out) as collator features, and the batch's own
    arrays over the same tokens, row after row."""
    features, keep = [], np.zeros(batch["input_ids"].shape, dtype=bool)
    for row, (ids, docs) in enumerate(zip(batch["input_ids"], batch["document_ids"])):
        bounds = [0, *np.flatnonzero(np.diff(docs)) + 1, len(ids)]
        for a, c in zip(bounds, bounds[1:]):
            if (ids[a:c] == 0).all():  # padding (documents() never uses id 0)
                continue
            features.append({"input_ids": ids[a:c].tolist()})
            keep[row, a:c] = True
    ours = {k: batch[k][keep][None] for k in ("input_ids", "labels", "position_ids")}
    return features, ours


@pytest.mark.parametrize("packing", ["concat", "greedy"])
def test_hf_batch_equals_data_collator_with_flattening(packing):
    batch = first_batch(packing, True, "hf")
    features, ours = flatten_like_hf(batch)
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    theirs = collator(features, return_tensors="np")
    for key in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(theirs[key], ours[key]), key
    lengths = [len(f["input_ids"]) for f in features]
    assert theirs["cu_seq_lens_q"].tolist() == np.cumsum([0, *lengths]).tolist()
    if packing == "concat":  # no padding: the very same boundaries
        assert np.array_equal(theirs["cu_seq_lens_q"], batch["cu_seqlens"])
        assert theirs["max_length_q"] == batch["max_seqlen"]
    else:
        assert ours["input_ids"].size < batch["input_ids"].size  # padding was left out


def test_options_and_fingerprint():
    assert StreamOptions(seq_len=8, batch_size=1).labels_format == "shifted"
    with pytest.raises(UsageError, match="labels_format"):
        StreamOptions(seq_len=8, batch_size=1, labels_format="HF")
    old = StreamOptions(seq_len=8, batch_size=1).to_dict()
    del old["labels_format"]  # what states saved before the option existed hold
    saved = {"sources": [], "options": old}
    now = {"sources": [], "options": StreamOptions(seq_len=8, batch_size=1).to_dict()}
    assert fingerprint_differences(saved, now) == []
    now["options"]["labels_format"] = "hf"
    assert fingerprint_differences(saved, now) == [
        "option labels_format: 'shifted' saved, 'hf' now"
    ]


def test_cli_labels_format(tmp_path, capsys):
    write_synthetic_dataset(tmp_path / "d", num_tokens=8000, vocab_size=500, mean_length=40,
                            shard_size=4000)  # fmt: skip
    dumps = {}
    for fmt in ("shifted", "hf"):
        out = tmp_path / f"{fmt}.npz"
        args = ["stream", str(tmp_path / "d"), "--seq-len", "31", "--batch-size", "3",
                "--packing", "greedy", "--mask-boundary-labels", "--max-batches", "3",
                "--labels-format", fmt, "--dump", str(out), "--json"]  # fmt: skip
        assert main(args) == 0
        dumps[fmt] = (np.load(out), capsys.readouterr().out)
    shifted, hf = dumps["shifted"][0], dumps["hf"][0]
    assert np.array_equal(shifted["input_ids"], hf["input_ids"])
    want = to_hf_labels(shifted["labels"].reshape(-1, 31).copy()).reshape(hf["labels"].shape)
    assert np.array_equal(hf["labels"], want)
    # The packing statistic reads the padding off the labels: the same in both formats.
    assert '"packing_efficiency"' in dumps["hf"][1]
    eff = [line for out in (dumps["shifted"][1], dumps["hf"][1])
           for line in out.splitlines() if "packing_efficiency" in line]  # fmt: skip
    assert eff[0] == eff[1]
    with pytest.raises(SystemExit) as exit_info:
        main(["stream", str(tmp_path / "d"), "--seq-len", "31", "--batch-size", "3",
              "--labels-format", "unshifted"])  # fmt: skip
    assert exit_info.value.code == 2


def test_memmap_dataset_labels_format(tmp_path):
    docs = [np.arange(n, dtype=np.uint16) + 7 * k for k, n in enumerate([5, 30, 12, 40, 9, 22])]
    write_megatron_pair(tmp_path / "pair", docs, np.uint16)
    made = {
        fmt: MemmapTokenDataset(
            tmp_path / "pair",
            seq_len=16,
            num_samples=6,
            seed=3,
            mask_boundary_labels=True,
            labels_format=fmt,
            shared_memory=False,
        )  # fmt: skip
        for fmt in ("shifted", "hf")
    }
    indices = [0, 3, 5]
    shifted, hf = (ds.collate(ds.__getitems__(indices)) for ds in made.values())
    want = to_hf_labels(shifted["labels"].numpy().copy())
    assert torch.equal(hf["labels"], torch.from_numpy(want))
    assert torch.equal(made["hf"][3]["labels"], hf["labels"][1])  # __getitem__ agrees
    with pytest.raises(UsageError, match="labels_format"):
        MemmapTokenDataset(tmp_path / "pair", seq_len=16, num_samples=6, labels_format="x")


def test_stream_dataset_and_loader_workers_carry_the_option(tmp_path):
    write_synthetic_dataset(tmp_path, num_tokens=6000, vocab_size=500, mean_length=40,
                            shard_size=3000)  # fmt: skip

    def batches(labels_format):  # both with 2 workers: the epoch's split depends on them
        ds = ShardStreamDataset(tmp_path, seq_len=31, batch_size=2, packing="greedy",
                                mask_boundary_labels=True, labels_format=labels_format)  # fmt: skip
        loader = ShardLoader(ds, num_workers=2)
        return [
            {k: v.numpy().copy() for k, v in b.items() if isinstance(v, torch.Tensor)}
            for b in loader
        ]

    shifted, hf = batches("shifted"), batches("hf")
    assert len(shifted) == len(hf) > 0
    for a, b in zip(shifted, hf):
        assert np.array_equal(b["labels"], to_hf_labels(a["labels"]))
        assert np.array_equal(a["input_ids"], b["input_ids"])


def test_a_state_saved_before_the_option_resumes_only_under_its_default(tmp_path):
    write_synthetic_dataset(tmp_path / "d", num_tokens=8000, vocab_size=500, mean_length=40,
                            shard_size=4000)  # fmt: skip
    options = dict(seq_len=16, batch_size=2)
    ds = ShardStreamDataset(tmp_path / "d", **options)
    next(iter(ds))
    state = ds.state_dict()
    del state["fingerprint"]["options"]["labels_format"]  # saved before the option existed
    assert "labels_format" not in json.dumps(state)
    ShardStreamDataset(tmp_path / "d", **options).load_state_dict(state)
    ShardStreamDataset(tmp_path / "d", **options, labels_format="shifted").load_state_dict(state)
    with pytest.raises(ResumeStateError, match="option labels_format: 'shifted' saved, 'hf' now"):
        ShardStreamDataset(tmp_path / "d", **options, labels_format="hf").load_state_dict(state)
