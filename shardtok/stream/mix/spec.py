"""Mix specifications: which datasets, with which weights, from Python, the CLI or YAML.

What names one dataset (``shardtok.dataset.shard_names``): a folder or URL prefix, or a subset
of its shards (a ``.tar`` file or URL, a brace pattern, a local glob, or a list of those). A
mix is always named as one:

* a mapping ``{dataset: weight}``: the given weights (any positive numbers; they are
  normalised); a key may be a subset (a pattern, or a tuple of shard files);
* ``--source`` on the command line (``stream_args``);
* a YAML config, as Nanotron's ``dataset_path`` (reference note 003): one dataset, a mapping,
  or a list of datasets whose weights are proportional to each one's token count (every token
  once per epoch on average, as Nanosets do).

In Python and on the command line a list is never a mix: it names shards of one dataset, and
shards of two datasets are refused with a pointer to the mapping.

A YAML file may hold them Nanotron-style (``data_stages: [{data: {dataset: {dataset_path: ...},
seed: ...}}]``) or flat (``dataset_path:`` plus stream options such as ``seed``, ``seq_len``,
``batch_size``, ``packing`` at the top level). Relative paths are read from the YAML file's
folder. A config may come from someone else: it is read with ``shardtok._safe_yaml`` (aliases,
nesting and integers bounded), and a bad one is one line naming it that echoes no value whole.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardtok._safe_yaml import SHOWN, YAMLError, explain, shown
from shardtok._safe_yaml import read as read_yaml
from shardtok.dataset.shard_names import select_shards
from shardtok.dataset.source import DatasetSource
from shardtok.errors import ShardtokError, UsageError
from shardtok.storage.location import Location
from shardtok.storage.origins import options_by_origin
from shardtok.stream.options import MAX_BATCH_TOKENS, OPTION_NAMES, StreamOptions


@dataclass
class MixSpec:
    """Resolved sources and their weights (weights proportional to tokens when not given)."""

    sources: list[DatasetSource]
    weights: list[float | int]
    options: dict[str, Any] = field(default_factory=dict)  # stream options the config set

    # Sources tokenized differently are refused unless this is set (see check_tokenizers).
    allow_mixed_tokenizers: bool = False

    @property
    def shares(self) -> list[float]:
        total = float(sum(self.weights))
        return [float(w) / total for w in self.weights]


def mix_spec(
    dataset_path: str | Path | Sequence[str | Path] | Mapping[Any, float],
    storage_options: dict[str, Any] | None = None,
    base: Path | None = None,
    *,
    list_is_mix: bool = False,
    from_config: bool = False,
) -> MixSpec:
    """Turn a ``dataset_path`` value into a MixSpec: one dataset (a location, or a subset: a
    pattern, glob, shard file or list of shards) or a mapping ``{dataset: weight}``.

    `list_is_mix`: a list is Nanotron's list of datasets mixed in proportion to their sizes (a
    config's ``dataset_path``; ``--source`` without weights), each entry one dataset.
    `storage_options` go to one origin only (``options_for``): a flat dict when every remote
    source shares one, else a dict keyed by origin (``{"https://host": {...}, ...}``).
    `from_config`: the locations come from a config file, whose writer chose the hosts, so a
    flat dict serves none of them (``options_by_origin``)."""
    options_for = options_by_origin(storage_options, from_config=from_config)

    def source(what: Any) -> DatasetSource:
        # Relative paths in a config file are relative to that file (`base`); URLs never are.
        chosen = select_shards(what, base=base)
        where = Location(chosen.root)
        return DatasetSource(chosen.root, options_for(where), shards=chosen.shards)

    if isinstance(dataset_path, Mapping):
        if not dataset_path:
            raise UsageError("a mix needs at least one dataset")
        sources = [source(p) for p in dataset_path]
        weights = list(dataset_path.values())
        for path, weight in zip(dataset_path, weights, strict=True):
            if (
                isinstance(weight, bool)
                or not isinstance(weight, (int, float))
                or not math.isfinite(weight)
                or weight <= 0
            ):
                raise UsageError(
                    f"weight of {_named(path)} is {shown(weight)}: weights must be > 0 and finite"
                )
        return MixSpec(sources, weights)
    if isinstance(dataset_path, (str, Path)) or not list_is_mix:
        return MixSpec([source(dataset_path)], [1])
    if not isinstance(dataset_path, Sequence):
        raise UsageError(f"dataset_path is {shown(dataset_path)}: a path, a list or a mapping")
    paths = list(dataset_path)
    if not paths:
        raise UsageError("a mix needs at least one dataset")
    sources = [source(p) for p in paths]
    first: dict[str, Any] = {}
    for path, each in zip(paths, sources, strict=True):
        if each.location in first:
            raise UsageError(
                f"{_named(first[each.location])} and {_named(path)} are both in "
                f"{each.root.display}: a list of datasets mixes datasets (weights proportional "
                "to size); name a subset of one dataset with one pattern instead, such as "
                "'shard-{000000..000003}.tar'"
            )
        first[each.location] = path
    return MixSpec(sources, [s.manifest.num_tokens for s in sources])


def _named(path: Any) -> str:
    """A mix entry as messages print it (a URL without credentials or query values)."""
    if isinstance(path, (str, Path)):
        return Location(str(path)).display
    return repr(tuple(Location(str(p)).display for p in path))


def load_mix_config(
    config: str | Path | Mapping[str, Any],
    *,
    stage: str | int = 0,
    storage_options: dict | None = None,
) -> MixSpec:
    """A MixSpec from a YAML file (or the dict it holds); `stage` picks a ``data_stages`` entry
    (``stages.load_curriculum`` reads them all)."""
    data, base, where = read_config(config)
    section: Mapping[str, Any] = data
    if "data_stages" in data:
        stages = stage_entries(data, where)
        if isinstance(stage, int):
            if not 0 <= stage < len(stages):
                raise ShardtokError(f"{where}: no data stage {stage} ({len(stages)} stages)")
            chosen = stages[stage]
        else:
            named = [s for s in stages if s.get("name") == stage]
            if not named:
                raise ShardtokError(f"{where}: no data stage named {shown(stage)}")
            chosen = named[0]
        section = chosen.get("data", {})
        if not isinstance(section, Mapping):
            raise ShardtokError(f"{where}: data stage {shown(stage)}: 'data' must be a mapping")
    return section_mix(
        section, data.get("allow_mixed_tokenizers", False), storage_options, base, where
    )


def stage_entries(data: Mapping[str, Any], where: str) -> list[Mapping[str, Any]]:
    """A config's ``data_stages``, each checked to be a mapping."""
    entries = data["data_stages"]
    if not isinstance(entries, list) or not entries:
        raise ShardtokError(f"{where}: data_stages must be a non-empty list of stages")
    for k, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ShardtokError(f"{where}: data stage {k} must be a mapping, got {shown(entry)}")
    return entries


def section_mix(section, allow_default, storage_options, base, where) -> MixSpec:
    """The mix a config's section names (a stage's ``data``, or a flat config): its
    ``dataset_path``, the stream options written there, and ``allow_mixed_tokenizers``."""
    dataset = section.get("dataset", section)
    if not isinstance(dataset, Mapping) or "dataset_path" not in dataset:
        raise ShardtokError(f"{where}: no dataset_path")
    paths = dataset["dataset_path"]
    _check_dataset_path(paths, where)
    try:
        spec = mix_spec(paths, storage_options, base, list_is_mix=True, from_config=True)
    except UsageError as exc:
        # The same mistake typed on the command line needs no file named; here it does.
        raise UsageError(f"{where}: {exc}") from None
    spec.options = config_options({**section, **dataset}, where)
    unknown = set(dataset) - set(OPTION_NAMES) - {"dataset_path", "allow_mixed_tokenizers"}
    if dataset is not section and unknown:  # a flat config may carry a trainer's other keys
        raise ShardtokError(
            f"{where}: unknown keys {shown(sorted(unknown, key=str))} next to dataset_path"
        )
    allow = {"allow_mixed_tokenizers": allow_default, **section, **dataset}
    allow = allow["allow_mixed_tokenizers"]
    if not isinstance(allow, bool):
        raise UsageError(
            f"{where}: allow_mixed_tokenizers must be true or false, got {shown(allow)}"
        )
    spec.allow_mixed_tokenizers = allow
    return spec


# Longer than any path or URL storage opens; refused before a message can echo it whole.
MAX_PATH = 4096


def _check_dataset_path(value: Any, where: str) -> None:
    """Refuse a config's dataset_path of a shape no mix has: one dataset (a path, URL or
    pattern), a list of datasets (each one, or a list of shards), or ``{dataset: weight}``."""

    def name(item: Any, what: str) -> None:
        if not isinstance(item, (str, os.PathLike)):
            raise ShardtokError(
                f"{where}: dataset_path holds {shown(item)} as {what}, not a path, URL or pattern"
            )
        text = os.fspath(item)
        if isinstance(text, str) and len(text) > MAX_PATH:
            raise ShardtokError(
                f"{where}: dataset_path holds a name of {len(text):,} characters, "
                f"{shown(text, 60)}: paths and URLs are at most {MAX_PATH:,}"
            )

    if isinstance(value, Mapping):
        for key in value:
            name(key, "a dataset")
    elif isinstance(value, list):
        for entry in value:
            if isinstance(entry, list):
                for shard in entry:
                    name(shard, "a shard")
            else:
                name(entry, "a dataset")
    else:
        name(value, "the dataset")


# What checks one stream option alone: the others at values that never conflict with it
# (stride is checked against seq_len, and the batch's size, again once the options are put
# together).
_ALONE = {"seq_len": MAX_BATCH_TOKENS, "batch_size": 1}


def config_options(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The stream options among a config's `values`, each checked on its own, naming the
    config: a bad one is refused here rather than when the stream starts."""
    options = {k: v for k, v in values.items() if k in OPTION_NAMES}
    for key, value in options.items():
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise UsageError(f"{where}: {key} must be one value, got {shown(value)}")
        if isinstance(value, str) and len(value) > SHOWN:
            raise UsageError(f"{where}: {key} is not {shown(value)}: no option is that long")
        try:
            alone = {**_ALONE, "seq_len": 1} if key == "batch_size" else _ALONE
            StreamOptions(**{**alone, key: value})
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
    return options


def read_config(config: str | Path | Mapping[str, Any]) -> tuple[Mapping, Path | None, str]:
    """(the config's mapping, the folder relative paths are read from, its name for messages)."""
    base: Path | None = None
    if isinstance(config, (str, Path)):
        path = Path(config)
        try:
            data = read_yaml(path)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ShardtokError(f"{path}: cannot read the mix config: {reason}") from None
        except YAMLError as exc:
            line, problem = explain(exc)
            at = f", line {line}" if line is not None else ""
            raise ShardtokError(f"{path}{at}: cannot read the mix config: {problem}") from None
        base = path.resolve().parent
        where = str(path)
    else:
        data, where = config, "mix config"
    if not isinstance(data, Mapping):
        raise ShardtokError(f"{where}: expected a mapping at the top level")
    return data, base, where


def _tokenizer_of(source: DatasetSource) -> str:
    manifest = source.manifest
    name = (manifest.tokenizer or {}).get("name")
    fingerprint = manifest.tokenizer_fingerprint
    described = f"{name!r}" if name else "an unnamed tokenizer"
    described += f" ({fingerprint})" if fingerprint else " (no fingerprint)"
    return f"{described}, vocabulary {manifest.vocab_size:,}"


def check_tokenizers(spec: MixSpec) -> None:
    """Refuse a mix whose sources were tokenized differently: ids of one vocabulary would be
    trained on as if they were the other's. Sources agree when their tokenizer fingerprints and
    vocabulary sizes are equal (two unfingerprinted sources: equal vocabulary sizes)."""
    if spec.allow_mixed_tokenizers or len(spec.sources) < 2:
        return
    first = spec.sources[0]
    key = (first.manifest.tokenizer_fingerprint, first.manifest.vocab_size)
    for other in spec.sources[1:]:
        if (other.manifest.tokenizer_fingerprint, other.manifest.vocab_size) != key:
            raise UsageError(
                f"the mix's sources were tokenized differently: {first.root.display} with "
                f"{_tokenizer_of(first)}, {other.root.display} with {_tokenizer_of(other)}; "
                "convert them with one tokenizer, or set allow_mixed_tokenizers "
                "(--allow-mixed-tokenizers) if their ids really mean the same tokens"
            )
