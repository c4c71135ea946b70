"""What a resume state was saved against: the sources and the options that decide the tokens.

A fingerprint names every source by its manifest's sha256 (which covers every shard's sha256 and
the tokenizer fingerprint) and weight, plus the ``StreamOptions``. Locations are kept for the
message but not compared, so a dataset copied to another folder or bucket still resumes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import MISSING, fields

from shardtok.errors import ResumeStateError
from shardtok.storage.dataset import DatasetSource
from shardtok.storage.location import display_url
from shardtok.stream.options import UNMASKED_DEFAULTS, StreamOptions

# A key a saved state lacks was saved before that option existed, for data without masks (the
# stream refused masked data until then), so it compares as that data's resolved default.
OPTION_DEFAULTS = {
    **{f.name: f.default for f in fields(StreamOptions) if f.default is not MISSING},
    **UNMASKED_DEFAULTS,
}


def source_fingerprint(source: DatasetSource) -> dict:
    manifest = source.manifest
    return {
        "location": source.location,
        "manifest_sha256": hashlib.sha256(manifest.to_bytes()).hexdigest(),
        "tokenizer": manifest.tokenizer_fingerprint,
        "num_tokens": manifest.num_tokens,
    }


def stream_fingerprint(
    sources: Sequence[DatasetSource], weights: Sequence[object] | None, options: StreamOptions
) -> dict:
    entries = [source_fingerprint(s) for s in sources]
    if weights is not None:
        for entry, weight in zip(entries, weights, strict=True):
            entry["weight"] = str(weight)
    return {"sources": entries, "options": options.to_dict()}


def _shown(entry: dict) -> str:
    # The stored location stays as given (old states compare equal); only its printed form is
    # redacted, since a pre-signed URL's signature or a user:password may be in it.
    return display_url(str(entry.get("location")))


def fingerprint_differences(saved: dict, current: dict) -> list[str]:
    """Human-readable differences that change the stream (empty when resumable)."""
    out: list[str] = []
    old, new = saved.get("sources", []), current.get("sources", [])
    if len(old) != len(new):
        out.append(f"{len(old)} sources saved, {len(new)} now")
    for i, (a, b) in enumerate(zip(old, new)):
        for key in ("manifest_sha256", "tokenizer", "num_tokens", "weight"):
            if a.get(key) != b.get(key):
                out.append(
                    f"source {i} ({_shown(a)} -> {_shown(b)}): {key} "
                    f"{a.get(key)!r} saved, {b.get(key)!r} now"
                )
    a_opts, b_opts = saved.get("options", {}), current.get("options", {})
    # An option a state was saved without did not exist yet; that code behaved as its default
    # does, so a missing key compares as the default (adding an option keeps old states valid).
    a_opts = {**OPTION_DEFAULTS, **a_opts}
    b_opts = {**OPTION_DEFAULTS, **b_opts}
    for key in sorted(set(a_opts) | set(b_opts)):
        if a_opts.get(key) != b_opts.get(key):
            out.append(f"option {key}: {a_opts.get(key)!r} saved, {b_opts.get(key)!r} now")
    return out


def check_fingerprint(saved: dict | None, current: dict, *, strict: bool = True) -> list[str]:
    """Refuse (ResumeStateError) a state saved against other data or options, unless not strict.

    Returns the differences (what a non-strict caller may want to log).
    """
    if saved is None:
        problems = ["the state carries no fingerprint"]
    else:
        problems = fingerprint_differences(saved, current)
    if problems and strict:
        raise ResumeStateError(
            "resume state was saved for other data or options: "
            + "; ".join(problems)
            + " (pass strict=False / --ignore-fingerprint to resume anyway)"
        )
    return problems
