"""What a resume state was saved against: the sources and the options that decide the tokens.

A fingerprint names every source by its manifest's sha256 (which covers every shard's sha256 and
the tokenizer fingerprint) and weight, plus the ``StreamOptions``. Locations are kept for the
message but not compared, so a dataset copied to another folder or bucket still resumes. A
source that streams a subset of its dataset's shards adds ``shards``: the subset as runs of
consecutive index.json entries (``"shard-000000.tar..shard-000003.tar"``, or one name), which
with the manifest's sha256 names it exactly; ``num_tokens`` is then the subset's. A source
without a subset (or with one naming every shard) has no ``shards`` key, so its fingerprint is
what it always was. The batch size is recorded but not compared (``LAYOUT_OPTIONS``): a resume
may change it, and every worker then continues the same rows in batches of the new size.

Curriculum stages (``staged_fingerprint``) add ``stages``: per stage its name, ``start_step``
(1-based), effective seed (its own, else the shared one), its own ``seq_len`` where it sets
one, and sources with weights; and
``stage_switch`` when stages continue their sources (absent:
they restart, the only rule before 0.4, so those states compare as ``restart``). A state of
stage k (the stage of the last batch it yielded) at training step s (that batch's 1-based step;
a merged elastic state at rank step T: the stage of step s = T + 1, which it resumes with; a
loader's or state file's workers: the furthest of them) resumes when

* the options other than the seed are equal (they are shared by every stage), and so is
  ``stage_switch``;
* stages 0..k are equal: start step, effective seed, sequence length (a merged state may
  change it, as the shared one), and every source (manifest, tokenizer, size, weight; names
  are not compared);
* stage k+1, if the config still has one, starts after step s.

Stages after k may change otherwise (added, removed, other sources, weights, seeds, later
starts): extending a curriculum that is under way is allowed. The shared seed is compared only
through the stages 0..k that use it. Any refusal names the stage and what differs. A mix's
state (a config of one stage streams a plain mix) is a state of stage 0 of a curriculum whose
stage 0 is that mix, so a run can grow from one stage into several.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError
from shardtok.format.shard_groups import GROUP_LIMIT
from shardtok.storage.location import display_url
from shardtok.stream.options import UNMASKED_DEFAULTS, StreamOptions

if TYPE_CHECKING:
    from shardtok.stream.mix.stages import Curriculum

# The shard order of datasets of more than GROUP_LIMIT shards (absent: one shard per group).
SHARD_ORDER_VERSION = "grouped-v2"

# A key a saved state lacks was saved before that option existed, for data without masks (the
# stream refused masked data until then), so it compares as that data's resolved default.
OPTION_DEFAULTS = {
    **{f.name: f.default for f in fields(StreamOptions) if f.default is not MISSING},
    **UNMASKED_DEFAULTS,
    # Before the option, the shuffle buffer had no token bound: such a state resumes with 0.
    "shuffle_tokens": 0,
}


def source_fingerprint(source: DatasetSource) -> dict:
    manifest = source.dataset_manifest
    entry = {
        "location": source.location,
        "manifest_sha256": manifest.sha256,  # index.compact records it: no row is read
        "tokenizer": manifest.tokenizer_fingerprint,
        "num_tokens": source.manifest.num_tokens,
    }
    # A subset naming every shard streams what the whole dataset does, so it resumes its states.
    if source.shards is not None and len(source.manifest.shards) < len(manifest.shards):
        entry["shards"] = shard_runs(source)
    # Beyond GROUP_LIMIT shards the epoch's shard order is by groups (stream/plan.py), which
    # releases before it did not plan: their states are refused, naming this version.
    if len(source.manifest.shards) > GROUP_LIMIT:
        entry["shard_order"] = SHARD_ORDER_VERSION
    return entry


def shard_runs(source: DatasetSource) -> list[str]:
    """A subset's shards as runs of consecutive index.json entries, ``"first..last"`` (both
    included) or one file name: short for the usual ranges, exact for any subset."""
    manifest = source.dataset_manifest
    positions = source.subset_positions or ()
    runs: list[str] = []
    start = 0
    for k in range(1, len(positions) + 1):
        if k == len(positions) or positions[k] != positions[k - 1] + 1:
            first = manifest.file_of(positions[start])
            last = manifest.file_of(positions[k - 1])
            runs.append(first if first == last else f"{first}..{last}")
            start = k
    return runs


def _shards_shown(runs: object) -> str:
    if runs is None:
        return "every shard"
    text = ", ".join(map(str, runs)) if isinstance(runs, list) else repr(runs)
    return text if len(text) <= 200 else text[:197] + "..."


def stream_fingerprint(
    sources: Sequence[DatasetSource], weights: Sequence[object] | None, options: StreamOptions
) -> dict:
    entries = [source_fingerprint(s) for s in sources]
    if weights is not None:
        for entry, weight in zip(entries, weights, strict=True):
            entry["weight"] = str(weight)
    return {"sources": entries, "options": options.to_dict()}


def staged_fingerprint(curriculum: Curriculum, options: StreamOptions) -> dict:
    """The fingerprint of curriculum stages: every source (for reference, not compared), the
    shared options, and per stage what decides its tokens (module docstring)."""
    known: dict[int, dict] = {}

    def entry(source: DatasetSource) -> dict:
        if id(source) not in known:  # a manifest's sha256 once, however many stages read it
            known[id(source)] = source_fingerprint(source)
        return dict(known[id(source)])

    stages = []
    for k, stage in enumerate(curriculum.stages):
        sources = [
            {**entry(s), "weight": str(w)} for s, w in zip(stage.mix.sources, stage.mix.weights)
        ]
        if curriculum.continues:  # their numbers in the table, which merge_states needs
            for source, cid in zip(sources, curriculum.source_ids(k), strict=True):
                source["id"] = cid
        own_length = {} if stage.seq_len is None else {"seq_len": stage.seq_len}
        stages.append({
            "name": stage.name,
            "start_step": stage.start_step,
            "seed": curriculum.options_for(k, options).seed,
            **own_length,
            "sources": sources,
        })  # fmt: skip
    switch = {"stage_switch": curriculum.stage_switch} if curriculum.continues else {}
    return {
        "sources": [entry(s) for s in curriculum.sources],
        "options": options.to_dict(),
        **switch,
        "stages": stages,
    }


def check_shape(fingerprint: object, where: str = "the state's fingerprint") -> dict:
    """A saved fingerprint shaped as the comparisons read it: damage is one line, not a
    traceback (values are compared, not checked: another value is a difference)."""

    def entries(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(e, dict) for e in value)

    if not isinstance(fingerprint, dict):
        raise ResumeStateError(f"{where} is damaged: expected an object")
    if not isinstance(fingerprint.get("options", {}), dict):
        raise ResumeStateError(f"{where} is damaged: 'options' must be an object")
    if not entries(fingerprint.get("sources", [])):
        raise ResumeStateError(f"{where} is damaged: 'sources' must be a list of objects")
    stages = fingerprint.get("stages", [{"start_step": 1}])
    if not entries(stages) or not stages:
        raise ResumeStateError(f"{where} is damaged: 'stages' must be a list of objects")
    for k, stage in enumerate(stages):
        start = stage.get("start_step")
        if (
            not isinstance(start, int)
            or isinstance(start, bool)
            or not entries(stage.get("sources", []))
        ):
            raise ResumeStateError(
                f"{where} is damaged: stage {k} needs an integer 'start_step' and a list of "
                "'sources'"
            )
    return fingerprint


def _shown(entry: dict) -> str:
    # The stored location stays as given (old states compare equal); only its printed form is
    # redacted, since a pre-signed URL's signature or a user:password may be in it.
    return display_url(str(entry.get("location")))


def fingerprint_differences(saved: dict, current: dict, merged: bool = False) -> list[str]:
    """Human-readable differences that change the stream (empty when resumable)."""
    if "stages" in saved and "stages" not in current:
        return [f"saved for {len(saved['stages'])} curriculum stages, now one dataset or mix"]
    out = _source_differences(saved.get("sources", []), current.get("sources", []), "")
    return out + _option_differences(saved, current, skip=REMAINDER_OPTIONS if merged else ())


def _source_differences(old: list, new: list, where: str) -> list[str]:
    out = []
    if len(old) != len(new):
        out.append(f"{where}{len(old)} sources saved, {len(new)} now")
    for i, (a, b) in enumerate(zip(old, new)):
        for key in ("manifest_sha256", "tokenizer", "num_tokens", "weight", "shard_order"):
            if a.get(key) != b.get(key):
                out.append(
                    f"{where}source {i} ({_shown(a)} -> {_shown(b)}): {key} "
                    f"{a.get(key)!r} saved, {b.get(key)!r} now"
                )
        if a.get("shards") != b.get("shards"):  # a subset (absent: the whole dataset)
            out.append(
                f"{where}source {i} ({_shown(a)} -> {_shown(b)}): shards "
                f"[{_shards_shown(a.get('shards'))}] saved, [{_shards_shown(b.get('shards'))}] now"
            )
    return out


def _option_differences(saved: dict, current: dict, skip: tuple[str, ...]) -> list[str]:
    # An option a state was saved without did not exist yet; that code behaved as its default
    # does, so a missing key compares as the default (adding an option keeps old states valid).
    a_opts = {**OPTION_DEFAULTS, **saved.get("options", {})}
    b_opts = {**OPTION_DEFAULTS, **current.get("options", {})}
    return [
        f"option {key}: {a_opts.get(key)!r} saved, {b_opts.get(key)!r} now"
        + (_BEFORE_OPTION.get(key, "") if key not in saved.get("options", {}) else "")
        + _THROUGH_REMAINDER.get(key, "")
        for key in sorted(set(a_opts) | set(b_opts))
        if key not in (*skip, *LAYOUT_OPTIONS) and a_opts.get(key) != b_opts.get(key)
    ]


# Options a resume may change: they group the same rows differently (docs/RESUME.md).
LAYOUT_OPTIONS = ("batch_size",)
# Options a resume from every worker's state (a merged state) may change: the rows are cut
# anew from what the old ones left (the remainder rule).
REMAINDER_OPTIONS = ("seq_len", "stride")
_THROUGH_REMAINDER = dict.fromkeys(
    REMAINDER_OPTIONS,
    " (a resume changes it from every worker's state: load_state_dict([...all of them...]) "
    "or merge_states; docs/RESUME.md)",
)


# What to do about an option a state was saved before, where its default changed since.
_BEFORE_OPTION = {
    "shuffle_tokens": " (saved before the shuffle buffer had a token bound: resume it exactly "
    "with shuffle_tokens=0, --shuffle-tokens 0)",
}


def _is_mix(fingerprint: dict) -> bool:
    sources = fingerprint.get("sources")
    return isinstance(sources, list) and bool(sources) and all("weight" in s for s in sources)


def as_first_stage(fingerprint: dict) -> dict:
    """A mix's fingerprint as that of curriculum stages whose stage 0 is the mix (what a config
    of one stage streams: its seed is the options' seed)."""
    seed = {**OPTION_DEFAULTS, **fingerprint.get("options", {})}.get("seed")
    stage = {"name": "the mix", "start_step": 1, "seed": seed, "sources": fingerprint["sources"]}
    return {**fingerprint, "stages": [stage]}


def stage_differences(
    saved: dict, current: dict, stage: int | None, step: int, merged: bool = False
) -> list[str]:
    """What keeps a state of stage `stage` at training step `step` (1-based) from resuming
    curriculum stages `current` (the rule in the module docstring); `stage` None compares
    every saved stage."""
    out = []
    if "stages" not in saved:
        if not _is_mix(saved):
            return [f"saved for one dataset, now {len(current['stages'])} curriculum stages"]
        saved = as_first_stage(saved)  # stage 0 alone: either switch rule continues it
    else:
        was = saved.get("stage_switch", "restart")
        now = current.get("stage_switch", "restart")
        if was != now:
            out.append(
                f"stage_switch {was!r} saved, {now!r} now (resume it exactly with "
                f"stage_switch: {was})"
            )
    old, new = saved["stages"], current["stages"]
    # The seed is compared per stage (a stage may have its own): a shared seed only later
    # stages use may change.
    out += _option_differences(
        saved, current, skip=("seed", *(REMAINDER_OPTIONS if merged else ()))
    )
    last = len(old) - 1 if stage is None else stage
    if last >= len(old):
        return [*out, f"the state is in stage {last}, but was saved with {len(old)} stages"]
    for k in range(last + 1):
        a = old[k]
        where = f"stage {k} ({a.get('name')!r}): "
        if k >= len(new):
            out.append(f"{where}the state reached it, but the config now has {len(new)} stages")
            break
        b = new[k]
        for key, shown in (("start_step", "start_training_step"), ("seed", "seed")):
            if a.get(key) != b.get(key):
                out.append(f"{where}{shown} {a.get(key)!r} saved, {b.get(key)!r} now")
        lengths = (_stage_length(saved, a), _stage_length(current, b))
        if lengths[0] != lengths[1] and not merged:
            out.append(f"{where}seq_len {lengths[0]!r} saved, {lengths[1]!r} now")
        out += _source_differences(a.get("sources", []), b.get("sources", []), where)
    if stage is not None and stage + 1 < len(new) and new[stage + 1]["start_step"] <= step:
        following = new[stage + 1]
        out.append(
            f"stage {stage + 1} ({following['name']!r}) now starts at step "
            f"{following['start_step']}, at or before step {step}, which the state reached in "
            f"stage {stage} ({old[stage].get('name')!r})"
        )
    return out


def _stage_length(fingerprint: dict, stage: dict) -> object:
    """A stage's sequence length: its own (recorded from 0.4 on where it sets one) or the
    shared one."""
    return stage.get("seq_len", (fingerprint.get("options") or {}).get("seq_len"))


RESUME_ANYWAY = " (pass strict=False / --ignore-fingerprint to resume anyway)"


def check_fingerprint(
    saved: dict | None,
    current: dict,
    *,
    strict: bool = True,
    stage: int | None = None,
    step: int = 0,
    advice: str = RESUME_ANYWAY,
    merged: bool = False,
) -> list[str]:
    """Refuse (ResumeStateError) a state saved against other data or options, unless not strict;
    the message ends with `advice` (a trace, which cannot replay other data, says so). A
    `merged` state (every old worker's) may change ``REMAINDER_OPTIONS`` too.

    For curriculum stages (`current` has ``stages``) `stage` and `step` say where the state is
    (``stream.staged.saved_position``): stages after `stage` may differ (module docstring);
    `stage` None compares them all. Returns the differences (what a non-strict caller may want
    to log).
    """
    if saved is None:
        problems = ["the state carries no fingerprint"]
    elif "stages" in current:
        problems = stage_differences(check_shape(saved), current, stage, step, merged)
    else:
        problems = fingerprint_differences(check_shape(saved), current, merged)
    if problems and strict:
        raise ResumeStateError(
            "resume state was saved for other data or options: " + "; ".join(problems) + advice
        )
    return problems
