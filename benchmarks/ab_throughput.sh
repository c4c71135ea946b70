#!/usr/bin/env bash
# Before/after throughput, interleaved: BEFORE and AFTER are two checkouts (e.g. `git worktree
# add /tmp/before REV`), both reading AFTER's .bench/stream (run `bench_stream.py prepare` there
# first; link BEFORE/.bench to it). Rounds alternate so that drifting machine load hits both.
#   bash benchmarks/ab_throughput.sh /tmp/before . 4 > ab.log
set -euo pipefail
before=$(cd "$1" && pwd); after=$(cd "$2" && pwd); rounds=${3:-4}
for round in $(seq "$rounds"); do
  for side in before after; do
    dir=$before; [ "$side" = after ] && dir=$after
    echo "=== round $round $side"
    (cd "$dir" && PYTHONPATH="$dir" python benchmarks/bench_stream.py throughput \
      --kinds lean,memlean --workers 0 2 | grep '^| shardtok')
  done
done
