"""Streaming: shard dataset -> epoch plan -> documents -> shuffle -> packing -> batches.

Torch-free (numpy only); ``shardtok.torch`` wraps it for DataLoaders. See docs/STREAMING.md.
"""

from shardtok.memmap.samples import GPTSamples
from shardtok.memmap.tokens import ConcatTokens, open_local_tokens
from shardtok.storage.dataset import DatasetSource
from shardtok.stream.batch import IGNORE_INDEX, build_batch
from shardtok.stream.mix.spec import MixSpec, load_mix_config, mix_spec
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.nodes.array_documents import ArrayDocuments
from shardtok.stream.nodes.base import DocumentNode, Node, take
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.nodes.concat import ConcatPacker, concat_window_count
from shardtok.stream.nodes.greedy import GreedyPacker
from shardtok.stream.nodes.reader import SliceReader
from shardtok.stream.nodes.sequence import PackedSequence
from shardtok.stream.nodes.shuffle import ShuffleBuffer
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import EpochPlan, Piece, SlicePlan, epoch_plan
from shardtok.stream.resume.elastic import ElasticStream
from shardtok.stream.resume.merge import merge_states
from shardtok.stream.slice_stream import SliceStream

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
