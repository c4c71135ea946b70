"""Datasets for the WebDataset stage's tests, made by the converter (text and fine-tuning with
loss masks), and what the native reader gives for them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.sft.config import load_sft_config
from shardtok.convert.sft.setup import prepare_sft
from shardtok.dataset.source import DatasetSource
from tests.helpers.sft_data import special_tokenizer, write_jsonl

SHAREGPT = "format: sharegpt\ntemplate: chatml\n"
# Small shards of small frames: every dataset has several shards of several frames each.
SMALL = {"unit_size": 2048, "frame_size": 512}
RUN = RunOptions(workers=1, progress=False)


@dataclass(frozen=True)
class Doc:
    key: str
    tokens: np.ndarray
    mask: np.ndarray | None


def native_documents(folder: Path) -> list[Doc]:
    """Every document of the dataset, in order, as the native streaming reader serves it."""
    dataset = DatasetSource(folder)
    masked = dataset.manifest.masked
    docs = []
    for entry in dataset.manifest.shards:
        reader, fileobj = dataset.open_stream(entry.file, with_masks=masked)
        with fileobj:
            for number, doc in enumerate(reader.documents(with_masks=masked)):
                tokens, mask = doc if masked else (doc, None)
                key = f"{entry.file.removesuffix('.tar')}/{number:06d}"
                docs.append(Doc(key, tokens.copy(), None if mask is None else mask.copy()))
    return docs


def shard_paths(folder: Path) -> list[str]:
    return [str(folder / e.file) for e in DatasetSource(folder).manifest.shards]


@pytest.fixture(scope="session")
def text_dataset(tmp_path_factory) -> Path:
    """A converted JSONL corpus: about 7 shards of uint16 tokens, zstd frames."""
    tmp = tmp_path_factory.mktemp("wds-text")
    rng = np.random.default_rng(0)
    words = [f"w{n}x{n * 7919 % 1000}" for n in range(500)]  # varied text: zstd keeps it large
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 120)))) for _ in range(200)]
    data = write_jsonl(tmp / "in.jsonl", [{"text": t} for t in texts])
    out = tmp / "ds"
    convert(
        ConvertJob(
            inputs=(str(data),),
            output=str(out),
            tokenizer=load_tokenizer("bundled"),
            shard_size=12_000,
            **SMALL,
        ),
        RUN,
    )
    assert len(DatasetSource(out).manifest.shards) >= 4
    return out


@pytest.fixture(scope="session")
def sft_dataset(tmp_path_factory) -> Path:
    """Converted chat records (--sft, ShareGPT with ChatML): shards with loss masks."""
    tmp = tmp_path_factory.mktemp("wds-sft")
    tok = special_tokenizer(tmp / "tok")
    rng = np.random.default_rng(1)
    words = [f"v{n}y{n * 104729 % 997}" for n in range(400)]

    def says() -> str:
        return " ".join(rng.choice(words, size=int(rng.integers(2, 60))))

    turns = ("human", "gpt", "human", "gpt")
    records = [
        {"conversations": [{"from": who, "value": says()} for who in turns[: 2 + 2 * (i % 2)]]}
        for i in range(80)
    ]
    data = write_jsonl(tmp / "chat.jsonl", records)
    (tmp / "sft.yaml").write_text(SHAREGPT)
    spec = load_tokenizer(str(tok), append_eos=False, backend="hf")
    sft = prepare_sft(load_sft_config(tmp / "sft.yaml", {}), spec, tok)
    out = tmp / "ds"
    convert(
        ConvertJob(
            inputs=(str(data),),
            output=str(out),
            tokenizer=spec,
            sft=sft,
            shard_size=10_000,
            **SMALL,
        ),
        RUN,
    )
    assert DatasetSource(out).manifest.masked and len(DatasetSource(out).manifest.shards) >= 2
    return out


@pytest.fixture(scope="session")
def int32_dataset(tmp_path_factory) -> Path:
    """Uncompressed shards (`.bin` members, crc32 frames) of int32 tokens (vocabulary > 65500)."""
    from shardtok.testing.synthetic import write_synthetic_dataset

    out = tmp_path_factory.mktemp("wds-int32") / "ds"
    write_synthetic_dataset(
        out, num_tokens=20_000, vocab_size=70_000, mean_length=120, shard_size=6_000,
        frame_size=2_000, compression_level=None,
    )  # fmt: skip
    return out
