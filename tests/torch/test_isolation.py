"""Packed documents reach a Hugging Face model isolated: every document's logits in a packed
batch equal its logits alone, under each attention implementation transformers runs on CPU,
with the model's config as shipped (``use_cache=True``), for fine-tuning and pretraining data,
greedy and bfd packing, and through ``transformers.Trainer`` fed by the dataset."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from shardtok.torch import ShardLoader, ShardStreamDataset
from tests.helpers.masked import Known
from tests.helpers.tiny_lm import tiny_causal_lm

transformers = pytest.importorskip("transformers")

LENGTHS = [int(n) for n in np.random.default_rng(3).integers(2, 30, size=60)]
KNOWN = Known(LENGTHS, first=1, seed=4)
VOCAB = KNOWN.end + 1
SEQ_LEN = 48
IMPLEMENTATIONS = ["eager", "sdpa", "flex_attention"]
CASES = [(data, packing) for data in ("sft", "pretrain") for packing in ("greedy", "bfd")]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("isolation")
    return {
        "sft": str(KNOWN.write(root / "sft")),
        "pretrain": str(KNOWN.write(root / "pretrain", masked=False)),
    }


def stock_lm(attn_implementation: str):
    model = tiny_causal_lm(VOCAB, layers=2, attn_implementation=attn_implementation)
    assert model.config.use_cache  # as shipped: the model makes a cache in every forward
    return model


def assert_isolated(model, batch) -> int:
    """Every segment of every row gets the logits it gets alone; returns the segments seen."""
    with torch.no_grad():
        packed = model(**batch).logits
        seen = 0
        for row in range(batch["input_ids"].shape[0]):
            docs = batch["document_ids"][row]
            for doc in torch.unique(docs):
                where = torch.nonzero(docs == doc).flatten()
                alone = model(input_ids=batch["input_ids"][row, where][None]).logits[0]
                torch.testing.assert_close(packed[row, where], alone, rtol=0, atol=1e-4)
                seen += 1
    return seen


@pytest.mark.parametrize("attn", IMPLEMENTATIONS)
def test_model_call_isolates_packed_documents(datasets, attn):
    # Every case in one test per implementation: flex attention compiles its kernel once per
    # process (seconds), not once per case.
    model = stock_lm(attn)
    for data, packing in CASES:
        ds = ShardStreamDataset(datasets[data], seq_len=SEQ_LEN, batch_size=4, packing=packing,
                                labels_format="hf", shuffle_buffer=0)  # fmt: skip
        batch = next(iter(ds))
        assert int(batch["document_ids"].max()) >= 1, (data, packing)  # documents share a row
        assert assert_isolated(model, batch) > 4, (data, packing)


def test_batches_from_loader_workers_isolate_too(datasets):
    ds = ShardStreamDataset(datasets["sft"], seq_len=SEQ_LEN, batch_size=4, labels_format="hf")
    batch = next(iter(ShardLoader(ds, num_workers=2)))
    assert assert_isolated(stock_lm("sdpa"), batch) > 4


@pytest.mark.parametrize("labels_format", ["shifted", "hf"])
def test_the_model_trains_the_same_targets_in_either_label_format(datasets, labels_format):
    """``model(**batch).loss`` is the mean cross-entropy over the trained targets: a shifted
    batch carries them as ``shift_labels``, so the model does not shift them again."""
    ds = ShardStreamDataset(datasets["sft"], seq_len=SEQ_LEN, batch_size=4,
                            labels_format=labels_format)  # fmt: skip
    batch = next(iter(ds))
    model = stock_lm("sdpa")
    with torch.no_grad():
        out = model(**batch)
    targets = batch["labels"]
    if labels_format == "hf":  # aligned with input_ids: the target of column i is at i + 1
        targets = torch.nn.functional.pad(targets[:, 1:], (0, 1), value=-100)
    want = torch.nn.functional.cross_entropy(
        out.logits.reshape(-1, VOCAB).float(), targets.reshape(-1), ignore_index=-100
    )
    torch.testing.assert_close(out.loss, want)


def test_trainer_fed_by_the_dataset_isolates_and_batches_sequences(datasets, tmp_path):
    """Trainer batches the sequences of a dataset built without batch_size with its own
    DataLoader and collator; the model it calls sees isolated documents."""
    ds = ShardStreamDataset(datasets["sft"], seq_len=SEQ_LEN, labels_format="hf",
                            packing="greedy")  # fmt: skip
    model = stock_lm("sdpa")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, report_to=[],
        use_cpu=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=ds)
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].shape == (4, SEQ_LEN)
    # The Trainer hands the model only its own arguments; document_ids come from the
    # same sequences, built again here to name the segments.
    rows = [next(it) for it in [iter(ds)] for _ in range(4)]
    batch = {**batch, "document_ids": torch.stack([r["document_ids"] for r in rows])}
    assert torch.equal(batch["input_ids"], torch.stack([r["input_ids"] for r in rows]))
    model_args = {k: v for k, v in batch.items() if k != "document_ids"}
    with torch.no_grad():
        packed = model(**model_args).logits
        for row in range(4):
            docs = batch["document_ids"][row]
            for doc in torch.unique(docs):
                where = torch.nonzero(docs == doc).flatten()
                alone = model(input_ids=batch["input_ids"][row, where][None]).logits[0]
                torch.testing.assert_close(packed[row, where], alone, rtol=0, atol=1e-4)


def test_the_documented_block_causal_mask_isolates_under_sdpa(datasets):
    """The mask of docs/MODELS.md, run as written, with F.scaled_dot_product_attention."""
    text = (Path(__file__).parents[2] / "docs" / "MODELS.md").read_text()
    block = text.split("```python\n")[1].split("```")[0]
    assert "def block_causal_mask" in block
    scope: dict = {}
    exec(block, scope)
    ds = ShardStreamDataset(datasets["sft"], seq_len=SEQ_LEN, batch_size=4, packing="bfd")
    batch = next(iter(ds))
    mask = scope["block_causal_mask"](batch["document_ids"])
    assert mask.shape == (4, 1, SEQ_LEN, SEQ_LEN) and mask.dtype == torch.bool
    torch.manual_seed(1)
    q, k, v = (torch.randn(4, 2, SEQ_LEN, 8) for _ in range(3))
    packed = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for row in range(4):
        docs = batch["document_ids"][row]
        for doc in torch.unique(docs):
            where = torch.nonzero(docs == doc).flatten()
            alone = torch.nn.functional.scaled_dot_product_attention(
                q[row : row + 1, :, where], k[row : row + 1, :, where], v[row : row + 1, :, where],
                is_causal=True,
            )  # fmt: skip
            torch.testing.assert_close(packed[row : row + 1, :, where], alone)


def test_an_old_transformers_is_warned_about_once(datasets, monkeypatch):
    from shardtok.torch import model_inputs

    monkeypatch.setattr(model_inputs, "_installed_transformers", lambda: "4.53.2")
    monkeypatch.setattr(model_inputs, "_warned", [])
    with pytest.warns(UserWarning, match=r"install transformers>=4.54"):
        ShardStreamDataset(datasets["sft"], seq_len=SEQ_LEN, batch_size=4, labels_format="hf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ShardStreamDataset(datasets["sft"], seq_len=SEQ_LEN, batch_size=4, labels_format="hf")
    monkeypatch.setattr(model_inputs, "_warned", [])
    monkeypatch.setattr(model_inputs, "_installed_transformers", lambda: "5.25.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ShardStreamDataset(datasets["sft"], seq_len=SEQ_LEN, batch_size=4, labels_format="hf")
