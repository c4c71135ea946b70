"""Streaming: shard dataset -> epoch plan -> documents -> shuffle -> packing -> batches.

Torch-free (numpy only); ``shardtok.torch`` wraps it for DataLoaders. See docs/STREAMING.md.
"""

from shardtok.stream.array_documents import ArrayDocuments
from shardtok.stream.batch import IGNORE_INDEX, build_batch
from shardtok.stream.batcher import Batcher
from shardtok.stream.concat import ConcatPacker, concat_window_count
from shardtok.stream.elastic import ElasticStream, merge_states
from shardtok.stream.greedy import GreedyPacker
from shardtok.stream.memmap_samples import GPTSamples
from shardtok.stream.memmap_tokens import ConcatTokens, open_local_tokens
from shardtok.stream.mix_config import MixSpec, load_mix_config, mix_spec
from shardtok.stream.mix_stream import MixedStream
from shardtok.stream.node import DocumentNode, Node, take
from shardtok.stream.pipeline import SliceStream, StreamOptions
from shardtok.stream.plan import EpochPlan, Piece, SlicePlan, epoch_plan
from shardtok.stream.reader import SliceReader
from shardtok.stream.sequence import PackedSequence
from shardtok.stream.shuffle import ShuffleBuffer
from shardtok.stream.sources import DatasetSource

__all__ = [
    "IGNORE_INDEX",
    "ArrayDocuments",
    "Batcher",
    "ConcatPacker",
    "ConcatTokens",
    "DatasetSource",
    "DocumentNode",
    "ElasticStream",
    "EpochPlan",
    "GPTSamples",
    "GreedyPacker",
    "MixSpec",
    "MixedStream",
    "Node",
    "PackedSequence",
    "Piece",
    "ShuffleBuffer",
    "SlicePlan",
    "SliceReader",
    "SliceStream",
    "StreamOptions",
    "build_batch",
    "concat_window_count",
    "epoch_plan",
    "load_mix_config",
    "merge_states",
    "mix_spec",
    "open_local_tokens",
    "take",
]
