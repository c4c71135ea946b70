"""Getting per-worker dataset states out of loader checkpoints, for a resume on another layout.

``ShardLoader.state_dict()`` lists them under ``workers``; ``StatefulDataLoader.state_dict()``
keeps each worker's ``dataset.state_dict()`` under
``_snapshot/_worker_snapshots/worker_<i>/dataset_state`` (with workers) or ``dataset_state``
(without). ``ShardStreamDataset.load_state_dict`` and ``ShardLoader.load_state_dict`` take a
list of every rank's loader states and do this themselves; ``dataset_states`` (torch-free, in
``shardtok.stream.resume.merge``) is for code that merges by hand::

    states = [s for rank_state in all_rank_loader_states for s in dataset_states(rank_state)]
    dataset.load_state_dict(merge_states(states))
"""

from shardtok.stream.resume.merge import dataset_states

__all__ = ["dataset_states"]
