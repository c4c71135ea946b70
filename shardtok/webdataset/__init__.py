"""shardtok datasets in WebDataset pipelines: one sample per document.

    import webdataset as wds
    import shardtok.webdataset

    docs = wds.WebDataset("ds/shard-{000000..000099}.tar", shardshuffle=100).compose(
        shardtok.webdataset.documents()
    )
    for sample in docs:  # {"__key__": "shard-000003/000017", "__url__": ..., "tokens": ...}
        ...

Every check the native reader makes runs on each shard (frames, sizes, idx, member order and
names, metadata, and the shard against its ``index.json``); damage raises ``CorruptShardError``
naming the URL, member and frame, never wrong tokens. See docs/WEBDATASET.md. Needs the optional
extra: ``pip install 'shardtok[webdataset]'``; ``import shardtok`` never imports webdataset.
"""

try:
    import webdataset  # noqa: F401 - the stages are pieces of its pipelines
except ModuleNotFoundError as exc:
    if exc.name != "webdataset":
        raise
    raise ImportError(
        "shardtok.webdataset needs the webdataset package: pip install 'shardtok[webdataset]'"
    ) from None

from shardtok.webdataset.stages import documents, stream_documents

__all__ = ["documents", "stream_documents"]
