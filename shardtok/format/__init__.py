"""The shard format: MMIDIDX indices, zstd frames, deterministic tar shards, the dataset manifest.

Byte-level specification: docs/FORMAT.md. This package needs only numpy and zstandard.
"""

from shardtok.format.dataset_writer import DatasetWriter
from shardtok.format.manifest import MANIFEST_NAME, Manifest, ShardEntry, load_manifest
from shardtok.format.megatron import MegatronPair, write_megatron_pair
from shardtok.format.mmidx import MMIndex, decode_idx, encode_idx
from shardtok.format.shard_reader import RangeSource, ShardReader, ShardStreamReader

__all__ = [
    "MANIFEST_NAME",
    "DatasetWriter",
    "MMIndex",
    "Manifest",
    "MegatronPair",
    "RangeSource",
    "ShardEntry",
    "ShardReader",
    "ShardStreamReader",
    "decode_idx",
    "encode_idx",
    "load_manifest",
    "write_megatron_pair",
]
