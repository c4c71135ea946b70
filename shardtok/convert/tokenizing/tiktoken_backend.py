"""A tiktoken encoder that gives exactly the ids of a Hugging Face byte-level BPE, and the gate
that decides when it may be used.

Why: for a tokenizer like Llama 3's, tiktoken's BPE encodes 4-5x faster per core than
`tokenizers`' `encode_batch_fast`, and the worker spends nearly all its time there.

When the two give the same ids (what :func:`check` verifies from the serialized tokenizer):

- no normalizer, or exactly NFC (Qwen2, Qwen3: see "NFC" below); no truncation or padding;
- the pre-tokenizer is either `ByteLevel(add_prefix_space=false, use_regex=true)` (the GPT-2
  regex) or `Sequence[Split(Regex, behavior Isolated, invert false),
  ByteLevel(add_prefix_space=false, use_regex=false)]`: one regex cut, then bytes, which is what
  tiktoken does with the same regex;
- the model is a BPE without dropout, continuing-subword prefix, end-of-word suffix or byte
  fallback, whose vocabulary holds all 256 byte symbols and only byte-level symbols;
- HF merges the adjacent pair of lowest merge priority, tiktoken the adjacent pair whose merged
  bytes have the lowest rank (here: the id). Proof that they take the same steps, given that the
  merges are sorted by the id of the token they make: while both agree, suppose tiktoken joins
  pieces l, r into a token t = l + r. The bytes of t were never merged with their neighbours, and
  BPE picks merges by rank alone, so HF's merges inside t happened in the order HF's BPE of t's
  bytes alone takes: that run reaches [l, r] too. If (l, r) is not a merge, the run stops there
  with two pieces; so when no vocabulary token's bytes BPE-merge (HF) to exactly two pieces, l, r
  is a merge, and by the sort order it is HF's lowest merge too (a tie is two pairs making the
  same token: when each token has one merge, the same merge, leftmost first in both). Both stop
  when no pair joins, and a merge is a pair tiktoken can join;
- tiktoken looks a whole regex piece up in the vocabulary before merging; HF does the same with
  `ignore_merges=true`. Without it (GPT-2, Qwen), a token whose bytes BPE-merge to something
  else is one HF never outputs (by the argument above it cannot end up as one piece), so it is
  left out of tiktoken's ranks; every other token BPE-merges to itself, as the lookup returns;
- added tokens are matched in the text exactly as HF does with `add_special_tokens=False`: HF
  still cuts documents at added-token text, so all added tokens are passed to tiktoken as
  allowed specials. That is equivalent only when no added token has lstrip/rstrip/single_word,
  none is a substring of another (HF takes the longest match, tiktoken the first alternative),
  and no normalized token can overlap a non-normalized one (HF matches those in two passes).

One case is outside the proof: two different merges that make the same token (`AM A` and `A MA`
both make `AMA`) have one rank in tiktoken, and when both are possible at once they are ordered
by merge priority in HF and by position in tiktoken. GPT-2 and the bundled tokenizer have no
token made by two merges, so for them the merge steps are proven equal; Llama 3 has 90,639 such
tokens, and no text was found that reaches that state (3,213 overlapping pairs; 36k
adversarial strings and a 16 MB corpus encode identically). Nor does the proof cover the regex:
the same pattern runs in Oniguruma (HF) and fancy-regex (tiktoken), whose Unicode tables may
differ on recently assigned characters. Both are left to the probe (probe.py) and the convert
canary, which re-encode text with HF and stop on any difference.

NFC (a tokenizer whose normalizer is exactly NFC, every added token normalized=false) is put in
front of the encoding by nfc_text.py, which says why that gives HF's ids; the gate refuses any
other normalizer, and normalized added tokens under NFC.

The merge checks cost ~2 s for a 128k vocabulary (0.6 s for GPT-2), so their verdict can be
cached on disk by tokenizer fingerprint, in a cache folder the caller names (nothing is cached
without one). The gate runs once, in the main process; forked workers inherit the built
encoding.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# Bump when the conditions change: cached verdicts of an older gate are then ignored.
# 2: "every split of a token is a merge" became "no token BPE-merges to two pieces", and tokens
# HF never outputs are left out of the ranks (GPT-2 and the bundled tokenizer qualify).
GATE_VERSION = 2

# tokenizers' ByteLevel pre-tokenizer regex (use_regex=true), as in its byte_level.rs.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-symbol table that byte-level BPE vocabularies are written in."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


@dataclass(frozen=True)
class TiktokenParts:
    """What `tiktoken.Encoding` is built from."""

    pattern: str
    ranks: dict[bytes, int]
    specials: dict[str, int]
    # The tokenizer's normalizer is NFC: texts go through NfcText before tiktoken.
    nfc: bool = False

    def build(self, name: str):
        import tiktoken

        return tiktoken.Encoding(
            name, pat_str=self.pattern, mergeable_ranks=self.ranks, special_tokens=self.specials
        )


class NotEquivalent(Exception):
    """The tokenizer is outside the conditions under which tiktoken gives HF's ids."""


def _pattern(pre: dict | None) -> str:
    if pre is None:
        raise NotEquivalent("no pre-tokenizer (a byte-level regex split is needed)")
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    level = steps[-1] if steps else {}
    if len(steps) not in (1, 2) or level.get("type") != "ByteLevel":
        raise NotEquivalent(
            f"pre-tokenizer {pre.get('type')} is not ByteLevel or Sequence[Split(Regex), ByteLevel]"
        )
    if level.get("add_prefix_space", False):
        raise NotEquivalent("pre-tokenizer ByteLevel has add_prefix_space=true")
    if len(steps) == 1:
        if not level.get("use_regex", True):
            raise NotEquivalent("pre-tokenizer ByteLevel alone needs use_regex=true")
        return GPT2_PATTERN
    split = steps[0]
    if split.get("type") != "Split":
        raise NotEquivalent(f"pre-tokenizer {split.get('type')} before ByteLevel is not a Split")
    regex = (split.get("pattern") or {}).get("Regex")
    if regex is None:
        raise NotEquivalent("pre-tokenizer Split splits on a string, not a regex")
    if split.get("behavior") != "Isolated" or split.get("invert", False):
        raise NotEquivalent(
            f"pre-tokenizer Split has behavior {split.get('behavior')} and invert "
            f"{split.get('invert')} (Isolated, not inverted is needed)"
        )
    if level.get("use_regex", True):
        raise NotEquivalent("pre-tokenizer ByteLevel after Split must have use_regex=false")
    return regex


def _merges(model: dict) -> list[tuple[str, str]]:
    pairs = []
    for merge in model.get("merges", []):
        parts = merge.split(" ") if isinstance(merge, str) else list(merge)
        if len(parts) != 2:
            raise NotEquivalent(f"merge {merge!r} is not a pair")
        pairs.append((parts[0], parts[1]))
    return pairs


# Byte-level symbol -> the latin-1 character of its byte, so str.translate + encode("latin-1")
# turns a vocabulary token into its bytes at C speed (0.05 s for 128k tokens, not 0.3 s).
_TO_LATIN1 = {ord(ch): b for b, ch in bytes_to_unicode().items()}


def _ranks(vocab: dict[str, int], leave_out: tuple[int, ...] = ()) -> dict[bytes, int]:
    """{token bytes: id} of a byte-level vocabulary, without the ids in `leave_out`."""
    ranks: dict[bytes, int] = {}
    for token, token_id in vocab.items():
        try:
            ranks[token.translate(_TO_LATIN1).encode("latin-1")] = int(token_id)
        except UnicodeEncodeError:  # a character outside the byte-level alphabet survived
            raise NotEquivalent(
                f"vocabulary token {token!r} is not written in byte-level symbols"
            ) from None
    if len(ranks) != len(vocab):
        raise NotEquivalent("two vocabulary tokens stand for the same bytes")
    if leave_out:
        drop = set(leave_out)
        ranks = {b: i for b, i in ranks.items() if i not in drop}
    return ranks


@dataclass(frozen=True)
class MergeVerdict:
    """What the slow merge checks found (cached by fingerprint)."""

    ok: bool
    reason: str | None = None
    # Ids HF's BPE never outputs (ignore_merges=false, the token's bytes BPE-merge to other
    # pieces): left out of tiktoken's ranks, whose whole-piece lookup would return them.
    unbuildable: tuple[int, ...] = ()


def _check_merge_order(model: dict, vocab: dict[str, int]) -> None:
    """Merge order equals rank order."""
    last = -1
    for left, right in _merges(model):
        merged = vocab.get(left + right)
        if merged is None or left not in vocab or right not in vocab:
            raise NotEquivalent(
                f"merge {left!r} {right!r} uses or makes a token not in the vocabulary"
            )
        if merged < last:
            raise NotEquivalent(
                f"merges are not sorted by the id of the token they make ({left + right!r}, "
                f"id {merged}, comes after id {last})"
            )
        last = merged


def _merge_results(backend_json: str, vocab: dict[str, int]):
    """(token, id, pieces) for every vocabulary token: HF's BPE of its bytes by merges alone
    (ignore_merges off, so the whole-token lookup does not answer)."""
    from tokenizers import Tokenizer

    model = Tokenizer.from_str(backend_json).model  # a model of its own: changed below
    if model.ignore_merges:
        model.ignore_merges = False
    tokenize = model.tokenize
    for token, token_id in vocab.items():
        yield token, token_id, tokenize(token)


def _unbuildable(backend_json: str, vocab: dict[str, int]) -> tuple[int, ...]:
    """Ids whose token's bytes BPE-merge to anything but that token (ignore_merges=false)."""
    return tuple(
        sorted(i for _, i, pieces in _merge_results(backend_json, vocab) if _other(pieces, i))
    )


def _other(pieces, token_id: int) -> bool:
    return len(pieces) != 1 or pieces[0].id != token_id


def _merge_verdict(backend_json: str, model: dict, vocab: dict[str, int]) -> MergeVerdict:
    try:
        _check_merge_order(model, vocab)
        if not model.get("ignore_merges", False):
            return MergeVerdict(True, None, _unbuildable(backend_json, vocab))
        for token, token_id, pieces in _merge_results(backend_json, vocab):
            if len(pieces) == 2:
                left, right = (p.value for p in pieces)
                raise NotEquivalent(
                    f"token {token!r} (id {token_id}) BPE-merges to {left!r} + {right!r}, "
                    "which is not a merge, and tiktoken would join them"
                )
        return MergeVerdict(True, None, ())
    except NotEquivalent as exc:
        return MergeVerdict(False, str(exc))


def _added_tokens(spec: dict) -> dict[str, int]:
    added = spec.get("added_tokens") or []
    for token in added:
        for flag in ("lstrip", "rstrip", "single_word"):
            if token.get(flag):
                raise NotEquivalent(f"added token {token['content']!r} has {flag}=true")
        if not token.get("content"):
            raise NotEquivalent("an added token is empty")
    contents = [t["content"] for t in added]
    for a in contents:
        for b in contents:
            if a != b and a in b:
                raise NotEquivalent(f"added token {a!r} is a substring of added token {b!r}")
    normalized = [t["content"] for t in added if t.get("normalized")]
    raw = [t["content"] for t in added if not t.get("normalized")]
    for a in normalized:
        for b in raw:
            for x, y in ((a, b), (b, a)):
                if any(x.endswith(y[:k]) for k in range(1, min(len(x), len(y)))):
                    raise NotEquivalent(
                        f"added tokens {x!r} and {y!r} can overlap and are matched in "
                        "different passes (one normalized, one not)"
                    )
    return {t["content"]: int(t["id"]) for t in added}


def _cache_path(cache_dir: str | os.PathLike, fingerprint: str) -> Path:
    return Path(cache_dir) / "tiktoken-gate" / (fingerprint.replace(":", "-") + ".json")


def _cached_merge_verdict(path: Path, fingerprint: str) -> MergeVerdict | None:
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):  # a damaged or foreign file: check again
            return None
        if data.get("gate_version") != GATE_VERSION or data.get("fingerprint") != fingerprint:
            return None
        unbuildable = tuple(int(i) for i in data["unbuildable"])
        return MergeVerdict(bool(data["ok"]), data.get("reason"), unbuildable)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store_merge_verdict(path: Path, fingerprint: str, verdict: MergeVerdict) -> None:
    record = {
        "gate_version": GATE_VERSION,
        "fingerprint": fingerprint,
        "ok": verdict.ok,
        "reason": verdict.reason,
        "unbuildable": list(verdict.unbuildable),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache folder only costs the check next time


def check(
    backend_json: str,
    fingerprint: str | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
) -> TiktokenParts:
    """The tiktoken construction for this serialized HF tokenizer, or NotEquivalent(reason).

    With a fingerprint and a cache_dir, the verdict of the slow merge checks is kept in
    CACHE_DIR/tiktoken-gate/ under the fingerprint and read back next time.
    """
    spec = json.loads(backend_json)
    nfc = _nfc_normalizer(spec)
    for key in ("truncation", "padding"):
        if spec.get(key) is not None:
            raise NotEquivalent(f"the tokenizer has {key} configured")
    pattern = _pattern(spec.get("pre_tokenizer"))
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise NotEquivalent(f"the model is {model.get('type')}, not BPE")
    if model.get("dropout") not in (None, 0, 0.0):
        raise NotEquivalent("BPE dropout is set")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise NotEquivalent(f"BPE has {key} {model[key]!r}")
    if model.get("byte_fallback"):
        raise NotEquivalent("BPE has byte_fallback")
    vocab: dict[str, int] = model.get("vocab") or {}
    ranks = _ranks(vocab)
    if len(set(ranks.values())) != len(ranks):
        raise NotEquivalent("two vocabulary tokens share an id")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise NotEquivalent(f"{len(missing)} of the 256 bytes have no token (first: {missing[0]})")
    specials = _added_tokens(spec)
    if nfc:
        normalized = next((t["content"] for t in spec["added_tokens"] if t.get("normalized")), None)
        if normalized is not None:
            raise NotEquivalent(
                f"added token {normalized!r} is normalized=true under an NFC normalizer"
            )

    cache = _cache_path(cache_dir, fingerprint) if fingerprint and cache_dir else None
    verdict = _cached_merge_verdict(cache, fingerprint) if cache else None
    if verdict is None:
        verdict = _merge_verdict(backend_json, model, vocab)
        if cache:
            _store_merge_verdict(cache, fingerprint, verdict)
    if not verdict.ok:
        raise NotEquivalent(verdict.reason)
    return TiktokenParts(pattern, _ranks(vocab, verdict.unbuildable), specials, nfc)


def _nfc_normalizer(spec: dict) -> bool:
    """Whether the normalizer is NFC (True) or absent (False); NotEquivalent for any other."""
    normalizer = spec.get("normalizer")
    if normalizer is None:
        return False
    if normalizer == {"type": "NFC"}:
        return True
    raise NotEquivalent(
        f"the tokenizer has a normalizer ({normalizer.get('type')}) other than NFC alone"
    )


def parts_unchecked(backend_json: str) -> TiktokenParts:
    """The construction without the checks, for a spawned worker whose parent already ran them."""
    spec = json.loads(backend_json)
    vocab = spec["model"]["vocab"]
    unbuildable = () if spec["model"].get("ignore_merges") else _unbuildable(backend_json, vocab)
    specials = {t["content"]: int(t["id"]) for t in spec.get("added_tokens") or []}
    pattern = _pattern(spec.get("pre_tokenizer"))
    nfc = spec.get("normalizer") is not None
    return TiktokenParts(pattern, _ranks(vocab, unbuildable), specials, nfc)
