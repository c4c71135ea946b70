"""Streaming: dataset -> epoch plan -> documents -> shuffle -> packing -> batches.

Torch-free (numpy only); ``shardtok.torch`` wraps it for DataLoaders. See docs/STREAMING.md and
docs/API.md. The rooms, from the bottom up (each imports only those before it): ``state`` (the
envelope every saved position is wrapped in), ``batch`` (rows into a batch), ``options`` (what
decides the tokens), ``plan`` (who reads what), ``nodes/`` (one stage per module), ``build``
(stages into a stream), ``slice_stream`` and ``remainder`` (an epoch's slice; what an old
layout left of one, cut anew), ``mix/`` (sources with cursors, weights, curriculum stages, a
mix's remainder), ``epochs``/``staged`` (a dataset's consecutive epochs; a curriculum's
schedule), ``preview`` (what a mix will read), ``resume/`` (saved positions, fingerprints,
merging every worker's, state files), ``factory`` (the one place that picks the stream for a
placement and a saved state) and ``provenance/`` (traces).
"""

from shardtok.stream.batch import IGNORE_INDEX
from shardtok.stream.epochs import EpochsStream
from shardtok.stream.factory import StreamSetup
from shardtok.stream.mix.spec import MixSpec, load_mix_config, mix_spec
from shardtok.stream.mix.stages import Curriculum, Stage, load_curriculum
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import EpochPlan, epoch_plan
from shardtok.stream.preview import mix_preview
from shardtok.stream.provenance import trace_step
from shardtok.stream.resume.merge import merge_states
from shardtok.stream.resume.saved import Placement
from shardtok.stream.slice_stream import SliceStream
from shardtok.stream.staged import StagedStream

__all__ = [
    "IGNORE_INDEX",
    "Curriculum",
    "EpochPlan",
    "EpochsStream",
    "MixSpec",
    "MixedStream",
    "Placement",
    "SliceStream",
    "Stage",
    "StagedStream",
    "StreamOptions",
    "StreamSetup",
    "epoch_plan",
    "load_curriculum",
    "load_mix_config",
    "merge_states",
    "mix_preview",
    "mix_spec",
    "trace_step",
]
