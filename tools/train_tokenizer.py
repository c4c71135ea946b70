"""Train the small byte-level BPE tokenizer bundled in shardtok/assets/tokenizer/.

Training text: every docstring of the CPython standard library, as written by
``shardtok sample-corpus`` (shardtok/convert/inputs/sample_corpus.py, no size limit). The bundled files
were produced on CPython 3.11.7 with tokenizers 0.23.3 by running, from the repository root:

    python tools/train_tokenizer.py --out shardtok/assets/tokenizer

The tokenizer is GPT-2 style: byte-level pre-tokenizer without a prefix space and a byte-level
decoder, so decode(encode(text)) == text for any text. Vocabulary: 8192 ids, of which
``<|endoftext|>`` (id 0, the EOS appended after each document) and ``<|bos|>`` (id 1, used by
``--prepend-bos``) are special. It is a demo tokenizer: small enough to ship (< 1 MB) and good
enough to make real-looking shards; use your model's own tokenizer for training runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from shardtok.convert.inputs.sample_corpus import write_sample_corpus

EOS = "<|endoftext|>"
BOS = "<|bos|>"
VOCAB_SIZE = 8192


def train(texts, vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS, BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def write_folder(tokenizer: Tokenizer, out: Path) -> None:
    """Write the three files `AutoTokenizer.from_pretrained(out)` needs (transformers 4.x and 5.x)."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"), pretty=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": None,
        "add_prefix_space": False,
        # Decoding must give back the exact input text (the round-trip tests rely on it).
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS}, indent=2) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("shardtok/assets/tokenizer"))
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        # Written to a file first so the exact training text can be kept and inspected.
        corpus = Path(tmp) / "corpus.jsonl"
        records, nbytes = write_sample_corpus(corpus, max_bytes=None)
        with open(corpus, encoding="utf-8") as lines:
            texts = [json.loads(line)["text"] for line in lines]
    tokenizer = train(texts, args.vocab_size)
    write_folder(tokenizer, args.out)
    print(
        f"trained on {records} docstrings ({nbytes} bytes of JSONL) from Python {sys.version.split()[0]}; "
        f"vocabulary {tokenizer.get_vocab_size()} -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
