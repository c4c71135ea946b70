#!/bin/bash
# Plan on the login node, tokenize on 100 nodes, merge on one: the whole Slurm recipe.
# usage: submit.sh OUT INPUT... [convert options], e.g.
#   submit.sh s3://bucket/web-llama3 's3://raw/web/*.jsonl.zst' --tokenizer ./llama3/
set -euo pipefail
OUT=$1; shift
shardtok convert plan "$@" -o "$OUT"
ARRAY=$(sbatch --parsable --array=0-99 convert-units.sbatch "$OUT")
sbatch --dependency=afterany:"$ARRAY" convert-merge.sbatch "$OUT"
