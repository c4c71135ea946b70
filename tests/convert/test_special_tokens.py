"""Which EOS/BOS a conversion adds, shown in its summary with id, string and where the choice
came from, and agreeing with the manifest and the tokens; --eos-token/--bos-token override; the
note for a chat tokenizer whose eos_token ends a turn (Qwen3's <|im_end|>)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardtok.convert import load_tokenizer
from shardtok.convert.tokenizing.tokenizer import TokenizerLoadError
from shardtok.format import ShardReader
from shardtok.format.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "tests" / ".tokenizers" / "qwen3"
needs_qwen3 = pytest.mark.skipif(
    not (QWEN3 / "tokenizer.json").exists(), reason="Qwen3 tokenizer not here"
)
QWEN3_NOTE = (
    "note: EOS is '<|im_end|>' (id 151645, from eos_token in tokenizer_config.json), which ends "
    "a chat turn; pretraining text usually ends documents with '<|endoftext|>' (id 151643): "
    "pass --eos-token '<|endoftext|>' for that"
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("special") / "corpus.jsonl"
    texts = ["The first document.", "A second one, with <|im_end|> in its text.", "Third."]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def convert_cli(corpus: Path, out: Path, *args: str, status: int = 0):
    done = subprocess.run(
        [sys.executable, "-m", "shardtok", "convert", str(corpus), "-o", str(out), "--workers",
         "1", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr
    return done


def documents(out: Path) -> list[list[int]]:
    return [
        np.asarray(tokens).tolist()
        for shard in load_manifest(out).shards
        for tokens in ShardReader(out / shard.file).documents()
    ]


def test_bundled_summary_names_eos_and_bos_as_the_manifest_and_tokens_have_them(corpus, tmp_path):
    out = tmp_path / "out"
    done = convert_cli(corpus, out, "--prepend-bos")
    lines = done.stdout.splitlines()
    assert (
        "  eos         '<|endoftext|>' (id 0) after every document "
        "(from eos_token in tokenizer_config.json)"
    ) in lines
    assert (
        "  bos         '<|bos|>' (id 1) before every document "
        "(from bos_token in tokenizer_config.json)"
    ) in lines
    manifest = load_manifest(out)
    assert (manifest.tokenizer["eos_id"], manifest.tokenizer["bos_id"]) == (0, 1)
    docs = documents(out)
    assert len(docs) == 3 and all(d[0] == 1 and d[-1] == 0 for d in docs)

    # Without --prepend-bos the BOS line says it is not added, and which one it would be.
    spec = load_tokenizer("bundled")
    assert spec.special_tokens_summary().splitlines()[1] == (
        "  bos         not added (--prepend-bos is off); the tokenizer's is '<|bos|>' "
        "(id 1, from bos_token in tokenizer_config.json)"
    )
    spec = load_tokenizer("bundled", append_eos=False, bos_token="<|endoftext|>")
    assert spec.bos_id == 0 and spec.special_tokens_summary().splitlines() == [
        "  eos         not added (--no-append-eos); the tokenizer's is '<|endoftext|>' "
        "(id 0, from eos_token in tokenizer_config.json)",
        "  bos         not added (--prepend-bos is off); the tokenizer's is '<|endoftext|>' "
        "(id 0, from --bos-token)",
    ]


@needs_qwen3
def test_qwen3_eos_is_its_eos_token_with_a_note_and_eos_token_overrides(corpus, tmp_path):
    done = convert_cli(corpus, tmp_path / "default", "--tokenizer", str(QWEN3))
    assert QWEN3_NOTE in done.stderr.splitlines()
    assert (
        "  eos         '<|im_end|>' (id 151645) after every document "
        "(from eos_token in tokenizer_config.json)"
    ) in done.stdout.splitlines()
    assert "  bos         not added (--prepend-bos is off); the tokenizer names none" in done.stdout
    assert load_manifest(tmp_path / "default").tokenizer["eos_id"] == 151645
    assert [d[-1] for d in documents(tmp_path / "default")] == [151645] * 3

    out = tmp_path / "separator"
    done = convert_cli(corpus, out, "--tokenizer", str(QWEN3), "--eos-token", "<|endoftext|>")
    assert "note:" not in done.stderr
    assert (
        "  eos         '<|endoftext|>' (id 151643) after every document (from --eos-token)"
    ) in done.stdout.splitlines()
    assert load_manifest(out).tokenizer["eos_id"] == 151643
    docs = documents(out)
    assert [d[-1] for d in docs] == [151643] * 3
    assert 151645 in docs[1][:-1]  # <|im_end|> in the text is still the text's own token


@needs_qwen3
def test_qwen3_has_no_bos_and_a_bare_tokenizer_json_no_eos_token():
    with pytest.raises(TokenizerLoadError, match="has no BOS token, .* with --bos-token TOKEN"):
        load_tokenizer(str(QWEN3), prepend_bos=True, backend="hf")
    # A bare tokenizer.json has no eos_token configured: the conventional names decide.
    spec = load_tokenizer(str(QWEN3 / "tokenizer.json"))
    assert (spec.eos_id, spec.eos_token, spec.eos_note) == (151643, "<|endoftext|>", "")
    assert spec.eos_source.startswith("no eos_token configured: the first special token of ")


def test_an_eos_token_not_in_the_vocabulary_is_an_error_naming_the_option(corpus, tmp_path):
    done = convert_cli(corpus, tmp_path / "o", "--eos-token", "<|im_end|>", status=1)
    assert done.stderr.splitlines()[-1] == (
        "shardtok convert: error: --eos-token '<|im_end|>' is not in the tokenizer's vocabulary"
    )
    with pytest.raises(TokenizerLoadError, match="not in the tokenizer's vocabulary"):
        load_tokenizer("bundled", bos_token="<s>")


def test_help_says_eos_and_bos_token_override(capsys):
    from shardtok.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "overriding the tokenizer's eos_token" in text
    assert "overriding the tokenizer's bos_token" in text
    assert "when the tokenizer names none" not in text


def test_a_finished_dataset_of_another_eos_is_not_taken_for_this_conversion(corpus, tmp_path):
    from shardtok.convert import ConvertJob, RunOptions, convert
    from shardtok.convert.job.output_dir import OutputDirError

    def run(**tokens):
        spec = load_tokenizer("bundled", **tokens)
        job = ConvertJob(inputs=(str(corpus),), output=str(tmp_path / "out"), tokenizer=spec)
        return convert(job, RunOptions(workers=1, progress=False))

    assert not run().already_complete
    assert run().already_complete
    with pytest.raises(
        OutputDirError,
        match=r"another tokenizer or EOS/BOS \(shardtok-bpe-8k, "
        r"eos_id 0, bos_id 1; this run: shardtok-bpe-8k, eos_id 1, bos_id 1\)",
    ):
        run(eos_token="<|bos|>")
    assert load_manifest(tmp_path / "out").tokenizer["eos_id"] == 0
