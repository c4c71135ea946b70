"""The stream's stages, one per module, each a ``Node`` (``reset(state)``, ``next()``,
``state_dict()``) in the spirit of torchdata's nodes, for composing pipelines of your own."""

from shardtok.stream.nodes.array_documents import ArrayDocuments
from shardtok.stream.nodes.base import DocumentNode, Node
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.nodes.bfd import BFDPacker
from shardtok.stream.nodes.concat import ConcatPacker
from shardtok.stream.nodes.greedy import GreedyPacker
from shardtok.stream.nodes.reader import SliceReader
from shardtok.stream.nodes.shuffle import ShuffleBuffer

__all__ = [
    "ArrayDocuments",
    "Batcher",
    "BFDPacker",
    "ConcatPacker",
    "DocumentNode",
    "GreedyPacker",
    "Node",
    "ShuffleBuffer",
    "SliceReader",
]
