"""What `shardtok stream` shows of the batches: real tokens, decoded text, the .npz dump."""

from __future__ import annotations

import sys

import numpy as np

from shardtok.errors import UsageError
from shardtok.stream.batch import IGNORE_INDEX

# Untrained text on a terminal: dim grey, so trained text stands out; elsewhere brackets, which
# survive pipes, files and copy-paste.
DIM, RESET = "\x1b[2;37m", "\x1b[0m"
OPEN, CLOSE = "[[", "]]"


def real_tokens(batch: dict, labels_format: str, pad_id: int, masked: bool) -> int:
    """Tokens of the batch's windows that are not padding (inputs plus each row's last target).

    Without loss masks a row's -100 tail is its padding. With masks the tail may be an
    untrained prompt, so padding is recognised as greedy writes it: the row's last segment,
    only `pad_id` tokens, no trained label (padding of only the window's extra token is then
    counted as real: one token in a row)."""
    labels = batch["labels"]
    rows, seq_len = labels.shape
    ignored = labels == IGNORE_INDEX
    if not masked:
        tail = np.where(ignored.all(axis=1), seq_len, np.argmin(ignored[:, ::-1], axis=1))
        if labels_format == "hf":
            # hf labels sit one column right of the shifted ones, so a padded row's -100 tail
            # is one shorter: the padding after `length` real tokens covers seq_len - length.
            tail = tail + (tail > 0)
        return int(rows * (seq_len + 1) - tail.sum())
    ids, docs = batch["input_ids"], batch["document_ids"]
    total = rows * (seq_len + 1)
    for row in range(rows):
        start = padding_start(ids[row], ignored[row], docs[row], pad_id)
        if start:  # a row of padding alone is left counted, as it always was
            total -= seq_len + 1 - start
    return total


def padding_start(ids: np.ndarray, ignored: np.ndarray, docs: np.ndarray, pad_id: int):
    """The input position where one row's padding begins, or None: greedy and bfd pad a row's
    end as a segment of its own, only `pad_id` tokens with no label trained (`ignored`, per
    position, in either labels format), which the batch does not mark otherwise."""
    last = int(np.searchsorted(docs, docs[-1], side="left"))  # the row's last segment
    if (ids[last:] == pad_id).all() and ignored[last:].all():
        return last
    return None


def trained_inputs(labels: np.ndarray, labels_format: str) -> np.ndarray:
    """Per input position, whether that token is a trained target (bool, like `labels`)."""
    trained = labels != IGNORE_INDEX
    if labels_format == "hf":  # aligned: label i is input i
        return trained
    out = np.zeros_like(trained)
    out[:, 1:] = trained[:, :-1]  # shifted: label i - 1 is the target that input i is
    return out


def marked_text(decode, ids: np.ndarray, trained: np.ndarray, colour: bool) -> str:
    """The text of `ids`, each run of untrained tokens dimmed (`colour`) or in [[brackets]]."""
    bounds = [0, *(np.flatnonzero(np.diff(trained.astype(np.int8))) + 1).tolist(), len(ids)]
    parts = []
    for a, c in zip(bounds, bounds[1:]):
        text = decode(ids[a:c].tolist())
        if trained[a]:
            parts.append(text)
        else:
            parts.append(f"{DIM}{text}{RESET}" if colour else f"{OPEN}{text}{CLOSE}")
    return "".join(parts)


def decoder(args, manifests: list):
    """A function decoding token ids with ``--tokenizer`` (default: the bundled one), refused
    when a manifest records another tokenizer and none was named (a warning when one was)."""
    from shardtok.convert.tokenizing.tokenizer import BUNDLED, TokenizerLoadError, load_tokenizer

    try:
        spec = load_tokenizer(args.tokenizer or BUNDLED, backend="hf")  # decoding: no tiktoken gate
    except TokenizerLoadError as exc:
        if args.tokenizer is None:
            raise
        raise UsageError(f"--tokenizer: {exc}") from None
    for manifest in manifests:
        recorded = (manifest.tokenizer or {}).get("fingerprint")
        if recorded and recorded != spec.fingerprint:
            message = (
                f"the data was tokenized with {manifest.tokenizer.get('name')!r} "
                f"({recorded[:19]}...), not with {spec.name!r}"
            )
            if args.tokenizer is None:
                raise UsageError(f"{message}; pass --tokenizer PATH")
            print(f"warning: {message}", file=sys.stderr)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(spec.backend_json)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    return decode


# Only these packers pad a row; concat rows are full windows of the token stream.
PADDING_PACKINGS = ("greedy", "bfd")


def decode_batches(decode, batches: list[dict], count: int, options) -> None:
    """The text of the first `count` sequences of `batches`, document by document (`decode`:
    from ``decoder``); padding is named with its positions, never decoded: its pad id is a
    real token of the vocabulary and would read as text."""
    colour = sys.stdout.isatty()
    legend = "dim" if colour else f"in {OPEN} {CLOSE}"
    print(f"(untrained tokens -- label -100: prompts, document starts -- are {legend})")
    shown = 0
    for b, batch in enumerate(batches):
        labels = batch["labels"]
        trained = trained_inputs(labels, options.labels_format)
        for row in range(len(batch["input_ids"])):
            if shown >= count:
                return
            ids = batch["input_ids"][row]
            docs = batch["document_ids"][row]
            padding = None
            if options.packing in PADDING_PACKINGS:
                ignored = labels[row] == IGNORE_INDEX
                padding = padding_start(ids, ignored, docs, options.pad_id)
            print(f"=== batch {b} sequence {row} ===")
            bounds = [0, *np.flatnonzero(np.diff(docs)) + 1, len(ids)]
            for a, c in zip(bounds, bounds[1:]):
                if a == padding:
                    print(
                        f"--- padding: positions {a}..{c - 1}, {c - a} tokens of pad id "
                        f"{options.pad_id}, none trained ---"
                    )
                    continue
                count_trained = int(trained[row, a:c].sum())
                print(
                    f"--- document {docs[a]}: positions {a}..{c - 1}, {count_trained} of "
                    f"{c - a} tokens trained ---"
                )
                print(marked_text(decode, ids[a:c], trained[row, a:c], colour))
            shown += 1


def dump_batches(path: str, batches: list[dict], plan_json: str) -> None:
    cu = [b["cu_seqlens"] for b in batches]
    offsets = np.zeros(len(cu) + 1, dtype=np.int64)
    np.cumsum([len(c) for c in cu], out=offsets[1:])
    np.savez(
        path,
        input_ids=np.stack([b["input_ids"] for b in batches]),
        labels=np.stack([b["labels"] for b in batches]),
        position_ids=np.stack([b["position_ids"] for b in batches]),
        document_ids=np.stack([b["document_ids"] for b in batches]),
        cu_seqlens=np.concatenate(cu) if cu else np.empty(0, np.int32),
        cu_seqlens_offsets=offsets,
        max_seqlen=np.array([b["max_seqlen"] for b in batches], dtype=np.int64),
        num_trained_tokens=np.array([b["num_trained_tokens"] for b in batches], dtype=np.int64),
        source_ids=(
            np.stack([b["source_ids"] for b in batches]) if batches else np.empty((0, 0), np.int64)
        ),
        plan=np.array(plan_json),
    )


def source_rows(mix, table, sequences: np.ndarray, extras: list[dict]) -> list[dict]:
    """Per source of `table` (what batches' ``source_ids`` index: the `mix`'s sources, or the
    one dataset when `mix` is None): its weight, the `sequences` counted from the batches and
    their share; plus what `extras` (the in-process streams' own rows, matched by source) add,
    such as the epochs reached."""
    weights = [float(w) for w in mix.shares] if mix is not None else [1.0]
    total = int(sequences.sum()) or 1
    known = {row["source"]: row for row in extras}
    rows = []
    for i, source in enumerate(table):
        row = {
            "source": source.display,
            "weight": weights[i],
            "sequences": int(sequences[i]),
            "share": int(sequences[i]) / total,
        }
        if "epochs" in known.get(source.display, {}):
            row["epochs"] = known[source.display]["epochs"]
        rows.append(row)
    return rows


def stage_rows(curriculum, per_stage: dict[int, np.ndarray]) -> list[dict]:
    """Per stage the batches reached and per source of it: its weight in that stage, the
    sequences counted from the batches (by curriculum-wide ``source_ids``) and their share."""
    rows = []
    for k in sorted(per_stage):
        stage, counts = curriculum.stages[k], per_stage[k]
        ids = curriculum.source_ids(k)
        total = int(sum(counts[i] for i in ids)) or 1
        for source, weight, i in zip(stage.mix.sources, stage.mix.shares, ids, strict=True):
            rows.append(
                {
                    "stage": stage.name,
                    "source": source.display,
                    "source_id": i,
                    "weight": weight,
                    "sequences": int(counts[i]),
                    "share": int(counts[i]) / total,
                }
            )
    return rows


def print_statistics(stats: dict, *, overlong: str | None, masked: bool) -> None:
    """`shardtok stream`'s statistics (``--json`` prints `stats` as they are) as text."""
    count, per_epoch, tokens = stats["batches"], stats["batches_per_epoch"], stats["input_tokens"]
    of = f" of {per_epoch:,}" if per_epoch is not None else ""
    if per_epoch is not None and count > per_epoch:  # --max-batches: on into later epochs
        of = f" ({per_epoch:,} per epoch)"
    print(
        f"streamed {count:,}{of} batches ({stats['engine']}): "
        f"{tokens:,} input tokens in {stats['seconds']:.3f} s = "
        f"{stats['tokens_per_second'] / 1e6:.1f} M tokens/s; first batch after "
        f"{stats['first_batch_seconds']:.3f} s"
    )
    print(
        f"packing: {100 * stats['packing_efficiency']:.2f}% of slots hold real tokens, "
        f"{stats['documents_per_sequence']:.2f} document segments per sequence; "
        f"{stats['trained_tokens']:,} labels trained ({100 * stats['trained_share']:.2f}% of "
        f"{tokens:,}{', the rest prompts, padding or document starts' if masked else ''})"
    )
    untrained = stats["batches_without_trained_tokens"]
    if untrained:
        print(
            f"warning: {untrained:,} batches have no trained label (a mean loss over one is "
            "NaN); with loss masks, check --overlong and --seq-len against the conversation "
            "lengths"
        )
    if stats.get("overlong_documents"):
        print(
            f"overlong documents ({overlong or 'truncate or split by source'}): "
            f"{stats['overlong_documents']:,} met, "
            f"{stats['overlong_tokens_dropped']:,} tokens dropped"
        )
    shares = stats["sources"]
    for row in shares if len(shares) > 1 else []:
        epochs = f", epochs {row['epochs']}" if "epochs" in row else ""
        stage = f"stage {row['stage']!r} " if "stage" in row else ""
        of = "of the stage's" if stage else "of these"
        print(
            f"{stage}source {row['source']}: weight {100 * row['weight']:.2f}%, "
            f"{row['sequences']:,} sequences = {100 * row['share']:.2f}% {of} batches{epochs}"
        )
