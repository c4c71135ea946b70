"""`shardtok trace`: which documents one training step's batch holds, and their text.

Recomputed from the epoch plan (and a saved state, when given) with the stream's own code over
token addresses (``shardtok.stream.provenance``): no log of the run is needed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from shardtok.cli.arguments import at_least
from shardtok.cli.stream_args import DATASET_HELP, add_stream_options, check_steps, setup_from
from shardtok.cli.stream_output import decoder, marked_text
from shardtok.dataset.shard_names import SHARD_SUFFIX
from shardtok.errors import ResumeStateError, UsageError
from shardtok.stream.factory import StreamSetup, check_stream_state
from shardtok.stream.provenance import trace_step
from shardtok.stream.provenance.states import saved_rank
from shardtok.stream.provenance.trace import source_table
from shardtok.stream.resume.rank_state import KIND as FILE_KIND
from shardtok.stream.resume.rank_state import load_state_file
from shardtok.stream.state import LEGACY_FILE_FORMAT

DESCRIPTION = """\
Print where every token of one training step's batch comes from: for each sequence of rank
R's batch at step N, its pieces of documents (source, shard file, document index in the shard
and in export-megatron's output, the token range of that document, the slots it fills) and
its padding. --decode prints each piece's text as well.

Give the options the training run streamed with (or its config), and its DataLoader workers per
rank (--num-workers, 0 for in-process: each count deals the batches out differently, so it is
never guessed), or --state, a position the run saved, whose layout the trace takes; step N is
1-based and counts batches per rank, as a trainer's steps do. The trace replays the worker's
stream as token addresses, reading only the shards' indexes, from the start of the step's epoch
(one dataset), of the run (a mix) or of its stage (a curriculum), or from --state, a saved
position of that rank. Each worker passes over its own batches only: about 0.3 s per 10,000 of
them at 8 x 2048 tokens with concat, 0.7-0.8 s with greedy or bfd (measured on 2 cores), so
step 1,000,000 of a concat mix with 2 workers takes about 14 s, and a --state saved shortly
before the step makes any trace quick.
"""

EPILOG = """\
examples:
  # rank 3's batch at step 1200 of a job with 8 ranks and 2 DataLoader workers per rank
  shardtok trace data/ --seq-len 2048 --batch-size 8 --world-size 8 --num-workers 2 \\
      --rank 3 --step 1200
  # a run that streamed some shards of a dataset: name them as it did (quote a pattern)
  shardtok trace 'data/shard-{000000..000003}.tar' --seq-len 2048 --batch-size 8 --step 10 \\
      --num-workers 0
  # a mix config (stream options inside it), with the text of every piece
  shardtok trace mix.yaml --step 1200 --rank 3 --world-size 8 --num-workers 2 --decode
  # after a resume: start from the rank's saved position (layout and epoch come from it,
  # workers too: a --num-workers that contradicts it is refused)
  shardtok trace mix.yaml --step 250000 --state rank3.json
  # plain data for scripts: sequences[i].segments[j] has source, shard, document,
  # dataset_document, tokens [begin, end) and positions [begin, end) in the seq_len + 1 window
  shardtok trace data/ --seq-len 2048 --batch-size 8 --num-workers 2 --step 10 --json
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "trace",
        help="which documents (shard, document, token range) one step's batch holds",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "target",
        nargs="*",
        metavar="CONFIG_OR_DATASET",
        help="a mix config (.yaml), or what `shardtok stream` takes as DATASET: " + DATASET_HELP,
    )
    p.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="PATH[:WEIGHT]",
        help="a mix given as in `shardtok stream` (repeatable) instead of CONFIG_OR_DATASET",
    )
    p.add_argument(
        "--stage", default=None, help="config: trace this data stage (index or name) alone"
    )
    p.add_argument(
        "--step", type=at_least(1), required=True, metavar="N", help="1-based training step"
    )
    add_stream_options(p)
    # None: not given, so a --state file's layout and epoch apply (else rank 0 of 1, epoch 0;
    # --num-workers must then be given).
    p.set_defaults(rank=None, world_size=None, num_workers=None, epoch=None)
    p.add_argument(
        "--max-batches",
        type=at_least(1),
        default=None,
        metavar="N",
        help="batches per rank the run was given (num_batches): a mix's length, or a dataset "
        "streamed on past one epoch",
    )
    p.add_argument(
        "--state",
        metavar="FILE",
        help="start from this saved position of the rank (a `shardtok stream --state-out` file, "
        "or a ShardLoader / dataset state saved as JSON); the step must come after it",
    )
    p.add_argument(
        "--allow-mixed-tokenizers",
        action="store_true",
        help="mix datasets whose tokenizers differ (as in `shardtok stream`)",
    )
    p.add_argument("--decode", action="store_true", help="print the text of every piece")
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer for --decode (default: the bundled one, if the data was made with it)",
    )
    p.add_argument("--json", action="store_true", help="print the trace as JSON")
    p.set_defaults(run=run)
    return p


def target_setup(args: argparse.Namespace) -> StreamSetup:
    """What the run streamed, from CONFIG_OR_DATASET / --source and the stream options."""
    targets = list(args.target or [])
    first = targets[0] if len(targets) == 1 else ""
    is_config = first.endswith((".yaml", ".yml")) or (
        Path(first).is_file() and not first.endswith(SHARD_SUFFIX)
    )
    args.config = first if is_config else None
    args.dataset = [] if is_config else targets
    return setup_from(args)  # a config of several stages without --stage: the curriculum


def _state(path: str, setup: StreamSetup):
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ResumeStateError(f"{path}: cannot read the state: {exc}") from None
    if isinstance(doc, dict) and (
        doc.get("kind") == FILE_KIND or doc.get("format") == LEGACY_FILE_FORMAT
    ):
        return load_state_file(path, check_state=check_stream_state)
    return doc


LAYOUT = ("rank", "world_size", "num_workers", "epoch")


def run(args: argparse.Namespace) -> int:
    given = {key: getattr(args, key) for key in LAYOUT}  # None: not on the command line
    check_steps(args.step, "--step")
    check_steps(args.max_batches, "--max-batches")
    # The stream arguments check --rank against --world-size; with --state those may come
    # from the file, and the trace checks them against it.
    args.rank = given["rank"] or 0
    args.world_size = given["world_size"] or (args.rank + 1 if args.state else 1)
    setup = target_setup(args)
    layout = {"rank": 0, "world_size": 1, "num_workers": 0, "epoch": 0}
    state = None
    if args.state:
        state = _state(args.state, setup)
        try:
            saved = saved_rank(state, setup)
        except ResumeStateError as exc:
            raise ResumeStateError(f"{args.state}: {exc}") from None
        layout = {
            "rank": saved.rank,
            "world_size": saved.world_size,
            "num_workers": len(saved.workers),
            "epoch": saved.epoch,
        }
        _check_workers(given["num_workers"], len(saved.workers), args.state)
    elif given["num_workers"] is None:
        # Each worker count deals the batches out differently: a default would name another
        # run's documents, as confidently as the right ones.
        raise UsageError(
            "give --num-workers N, the DataLoader workers per rank the run trained with (0 for "
            "in-process), or --state FILE, a position it saved"
        )
    layout.update({key: value for key, value in given.items() if value is not None})
    trace = trace_step(setup, step=args.step, num_batches=args.max_batches, state=state, **layout)
    if args.decode:
        _add_text(trace, setup, args)
    if args.json:
        print(json.dumps(trace, indent=1))
    else:
        print_trace(trace)
    return 0


def _check_workers(given: int | None, saved: int, path: str) -> None:
    """A --num-workers beside --state must be the state's: it records the run's worker streams
    (one for 0 workers, in process, or 1)."""
    if given is not None and max(given, 1) != saved:
        raise UsageError(
            f"--num-workers {given} contradicts {path}, saved by a run with {saved} worker "
            f"stream(s) per rank: leave --num-workers out (the state says it)"
        )


def print_trace(trace: dict) -> None:
    """The trace as one block per sequence, one line per piece (and its text, if decoded)."""
    part = "".join(f", {k} {v}" for k, v in trace["part"].items())
    resumed = (
        f", from the state after step {trace['state_steps']:,}"
        if trace["state_steps"] is not None
        else ""
    )
    print(
        f"step {trace['step']:,}, rank {trace['rank']} of {trace['world_size']}: worker "
        f"{trace['worker']} of {max(trace['num_workers'], 1)}, its batch {trace['local_batch']:,} "
        f"(epoch {trace['epoch']}{part}{resumed})"
    )
    print(
        f"{trace['batch_size']} sequences of {trace['seq_len'] + 1} slots (inputs are slots "
        f"0..{trace['seq_len'] - 1}, targets 1..{trace['seq_len']}), {trace['packing']} packing"
    )
    several = len(trace["sources"]) > 1
    for s in trace["sources"] if several else []:
        print(f"  source {s['id']}: {s['location']}")
    for seq in trace["sequences"]:
        where = f"source {seq['source']}, " if several else ""
        print(f"=== sequence {seq['row']} ({where}{seq['length']:,} real tokens) ===")
        for g in seq["segments"]:
            a, b = g["positions"]
            begin, end = g["tokens"]
            print(
                f"  slots [{a}, {b}): {g['shard']} document {g['document']:,} tokens "
                f"[{begin:,}, {end:,}) of {g['document_length']:,}  (dataset document "
                f"{g['dataset_document']:,}" + (f", source {g['source']}" if several else "") + ")"
            )
            if "text" in g:
                print("\n".join(f"    | {line}" for line in g["text"].split("\n")))
        if seq["padding"] is not None:
            a, b = seq["padding"]
            print(f"  slots [{a}, {b}): padding (pad id {trace['pad_id']})")


def _add_text(trace: dict, setup: StreamSetup, args: argparse.Namespace) -> None:
    """Every piece's text (``text``), read from its shard; with loss masks the untrained runs
    are in [[brackets]] (``untrained``: how many tokens)."""
    import numpy as np

    table = source_table(setup)
    decode = decoder(args, [table[s["id"]].manifest for s in trace["sources"]])
    readers: dict[tuple[int, str], object] = {}
    for seq in trace["sequences"]:
        for g in seq["segments"]:
            source = table[g["source"]]
            key = (g["source"], g["shard"])
            if key not in readers:
                readers[key] = source.open_random(g["shard"])
            reader = readers[key]
            begin, end = g["tokens"]
            ids = np.asarray(reader.document(g["document"])[begin:end])  # type: ignore[attr-defined]
            if source.manifest.masked:
                trained = reader.document_mask(g["document"])[begin:end] == 1  # type: ignore[attr-defined]
                g["untrained"] = int((~trained).sum())
                g["text"] = marked_text(decode, ids, trained, colour=False)
            else:
                g["text"] = decode(ids.tolist())
    for reader in readers.values():
        reader.source.close()  # type: ignore[attr-defined]
