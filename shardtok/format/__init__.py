"""The shard format: MMIDIDX indices, zstd frames, deterministic tar shards, the dataset manifest.

Byte-level specification: docs/FORMAT.md. This package needs only numpy and zstandard.
"""

from shardtok.format.dataset_writer import DatasetWriter, shard_file_name
from shardtok.format.manifest import MANIFEST_NAME, Manifest, ShardEntry, load_manifest
from shardtok.format.megatron import MegatronPair, write_megatron_pair
from shardtok.format.mmidx import MMIndex, decode_idx, dtype_for_vocab, encode_idx
from shardtok.format.shard_meta import Frame, ShardMeta
from shardtok.format.shard_reader import RangeSource, ShardReader, ShardStreamReader

__all__ = [
    "MANIFEST_NAME",
    "DatasetWriter",
    "Frame",
    "RangeSource",
    "MMIndex",
    "Manifest",
    "MegatronPair",
    "ShardEntry",
    "ShardMeta",
    "ShardReader",
    "ShardStreamReader",
    "decode_idx",
    "dtype_for_vocab",
    "encode_idx",
    "load_manifest",
    "shard_file_name",
    "write_megatron_pair",
]
