"""The comparison benchmark: shardtok against WebDataset, MosaicML Streaming, LitData, Megatron
and a numpy memmap loader. Entry point: `python -m benchmarks.compare.run`; see docs/BENCHMARKS.md."""
