"""What a ShardStreamDataset's arguments become: its StreamOptions, and the one stream source
(a dataset, a mix or a curriculum) with its retry policy and tokenizer rule applied."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardtok.dataset.source import DatasetSource
from shardtok.errors import UsageError
from shardtok.storage.retry import RetryPolicy
from shardtok.stream.factory import use_retry
from shardtok.stream.mix.spec import MixSpec, mix_spec
from shardtok.stream.mix.stages import Curriculum
from shardtok.stream.options import OPTION_NAMES, StreamOptions

_SAMPLE_LABELS = (
    "a ShardStreamDataset without batch_size yields single sequences for a DataLoader or a "
    "Trainer to batch: say which labels they need, labels_format='hf' for Hugging Face models "
    "and Trainer (labels aligned with input_ids; the model shifts them) or 'shifted' for a loop "
    "that computes its own loss (labels[i] is the target of input_ids[i])"
)


def _check_sample_labels(stream_options: dict) -> None:
    # Trainer keeps only the model's own arguments, so the shift_labels that make a shifted
    # batch right for model(**batch) never reach the model there: a silent default here would
    # train two tokens ahead.
    if "labels_format" not in stream_options:
        raise UsageError(_SAMPLE_LABELS)


def stream_options_of(
    options: StreamOptions | None, stream_options: dict[str, Any]
) -> tuple[StreamOptions, bool]:
    """(the options, whether the dataset yields single sequences). Without batch_size it
    yields single sequences, for a DataLoader (or a Trainer) to batch: a stream of batches of
    one, each position exact as ever."""
    yields_samples = options is None and "batch_size" not in stream_options
    if options is None:
        names = set(OPTION_NAMES)
        unknown = sorted(set(stream_options) - names)
        if unknown:
            raise TypeError(
                f"ShardStreamDataset got unknown option(s) {unknown}; stream options are "
                f"{sorted(names)}"
            )
        if yields_samples:
            _check_sample_labels(stream_options)
            stream_options = {**stream_options, "batch_size": 1}
        options = StreamOptions(**stream_options)
    elif stream_options:
        raise TypeError("give either options=StreamOptions(...) or its fields, not both")
    return options, yields_samples


def stream_source(
    dataset, storage_options: dict | None, retry: RetryPolicy | None, allow_mixed_tokenizers: bool
) -> DatasetSource | MixSpec | Curriculum:
    """`dataset` as a source, mix or curriculum, its retry policy set before the first read."""
    if isinstance(dataset, Mapping):
        dataset = mix_spec(dataset, storage_options)
    elif not isinstance(dataset, (MixSpec, Curriculum, DatasetSource)):
        dataset = DatasetSource.of(dataset, storage_options)  # a list: shards, never a mix
    use_retry(dataset, retry)
    if isinstance(dataset, Curriculum):
        for stage in dataset.stages:
            stage.mix.allow_mixed_tokenizers |= allow_mixed_tokenizers
    elif isinstance(dataset, MixSpec):
        dataset.allow_mixed_tokenizers |= allow_mixed_tokenizers
    return dataset
