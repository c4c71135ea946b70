"""`shardtok import-megatron` and `shardtok export-megatron`: .bin/.idx pairs in and out."""

from __future__ import annotations

import argparse
from pathlib import Path

from shardtok.cli.arguments import parse_compression, parse_size


def _add_writer_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shard-size",
        type=parse_size,
        default="64MiB",
        help="stored bytes per shard before rolling over (default 64MiB)",
    )
    parser.add_argument(
        "--compression-level",
        type=parse_compression,
        default=3,
        help="zstd level 1-22, or 0 to store the .bin uncompressed (memory-mappable in place); default 3",
    )


def add_import_parser(sub) -> None:
    p = sub.add_parser(
        "import-megatron",
        help="turn a Megatron .bin/.idx pair into shards",
        description="Read PREFIX.bin and PREFIX.idx and write a shardtok dataset, one document "
        "per Megatron sequence. OUT_DIR must be new or empty, or hold a dataset to replace "
        "with --overwrite (files that are not shardtok's are never deleted).",
        epilog="example:\n  shardtok import-megatron corpus_text_document data/ --vocab-size 128256",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("prefix", help="path of the pair without .bin/.idx")
    p.add_argument("out_dir", help="output dataset folder")
    p.add_argument(
        "--vocab-size", type=int, help="tokenizer vocabulary size (default: largest token id + 1)"
    )
    p.add_argument("--tokenizer-name", help="recorded in the metadata")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset already in OUT_DIR (without it, an existing dataset is refused)",
    )
    _add_writer_options(p)
    p.set_defaults(run=_run_import_megatron)


def _run_import_megatron(args) -> int:
    from shardtok.convert.job.output_dir import prepare_new_dataset
    from shardtok.format.megatron_io import import_megatron

    prepare_new_dataset(Path(args.out_dir), args.overwrite)
    tokenizer = {"name": args.tokenizer_name} if args.tokenizer_name else None
    manifest = import_megatron(
        args.prefix,
        args.out_dir,
        vocab_size=args.vocab_size,
        tokenizer=tokenizer,
        shard_size=args.shard_size,
        compression_level=args.compression_level,
    )
    print(
        f"wrote {len(manifest.shards)} shards, {manifest.num_documents:,} documents, {manifest.num_tokens:,} tokens to {args.out_dir}"
    )
    return 0


def add_export_parser(sub) -> None:
    p = sub.add_parser(
        "export-megatron",
        help="merge a dataset into one Megatron .bin/.idx pair",
        description="Write OUT_PREFIX.bin and OUT_PREFIX.idx exactly as megatron-core's IndexedDatasetBuilder would.",
        epilog="example:\n  shardtok export-megatron data/ megatron/corpus_text_document",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dataset", help="dataset folder")
    p.add_argument("out_prefix", help="output path without .bin/.idx")
    p.add_argument(
        "--mask",
        action="store_true",
        help="also write OUT_PREFIX_mask.bin/.idx: the loss masks as a uint8 pair, same sizes",
    )
    p.set_defaults(run=_run_export_megatron)


def _run_export_megatron(args) -> int:
    from shardtok.format.megatron_io import export_megatron

    docs, tokens = export_megatron(args.dataset, args.out_prefix, masks=args.mask)
    print(
        f"wrote {args.out_prefix}.bin and {args.out_prefix}.idx: {docs:,} documents, {tokens:,} tokens"
    )
    if args.mask:
        print(f"wrote {args.out_prefix}_mask.bin and {args.out_prefix}_mask.idx")
    return 0
