"""Streaming: dataset -> epoch plan -> documents -> shuffle -> packing -> batches.

Torch-free (numpy only); ``shardtok.torch`` wraps it for DataLoaders. See docs/STREAMING.md and
docs/API.md. The rooms: ``options`` (what decides the tokens), ``plan`` (who reads what),
``nodes/`` (one stage per module), ``build`` (stages into a stream), ``slice_stream``,
``mix/`` (weighted sources), ``resume/`` (fingerprints, elastic resume, state files, 0.1
states), ``state`` (the envelope every saved state is wrapped in) and ``factory`` (the one place
that picks the stream for a placement and a saved state).
"""

from shardtok.stream.batch import IGNORE_INDEX
from shardtok.stream.factory import StreamSetup
from shardtok.stream.mix.spec import MixSpec, load_mix_config, mix_spec
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import EpochPlan, epoch_plan
from shardtok.stream.resume.merge import merge_states
from shardtok.stream.resume.saved import Placement
from shardtok.stream.slice_stream import SliceStream

__all__ = [
    "IGNORE_INDEX",
    "EpochPlan",
    "MixSpec",
    "MixedStream",
    "Placement",
    "SliceStream",
    "StreamOptions",
    "StreamSetup",
    "epoch_plan",
    "load_mix_config",
    "merge_states",
    "mix_spec",
]
