"""Provenance: which documents a training step's batch holds, recomputed from the plan alone.

``addresses``: sources whose documents are token addresses (shard, offset) instead of ids;
``trace``: one step's batch streamed over them and decoded into documents; ``states``: the
saved positions a trace may start from.
"""

from shardtok.stream.provenance.addresses import AddressSource, split_addresses
from shardtok.stream.provenance.trace import trace_step

__all__ = ["AddressSource", "split_addresses", "trace_step"]
