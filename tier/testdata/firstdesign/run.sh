#!/usr/bin/env bash
# The engines against their first design (21c98c6, the code before one block protocol and a ring per
# CPU): cmp_test.go.txt, built into a worktree of each, runs in interleaved rounds, and table.py prints
# each benchmark's keys a second, now ÷ first design per round (median, range) and CPU a key.
# usage: bash tier/testdata/firstdesign/run.sh [ROUNDS=5] [BENCHTIME=1s] [BENCH=BenchmarkCmp]
# Stores go to a tmpfs at CMP_STORE_DIR if set (no device noise), else to the test's temporary directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(git -C "$here" rev-parse --show-toplevel)
rounds=${1:-5} benchtime=${2:-1s} bench=${3:-BenchmarkCmp}
work=$(mktemp -d)
trap 'git -C "$top" worktree remove --force "$work/old" >/dev/null 2>&1; git -C "$top" worktree remove --force "$work/new" >/dev/null 2>&1; rm -rf "$work"' EXIT
git -C "$top" worktree add -q --detach "$work/old" 21c98c6
git -C "$top" worktree add -q --detach "$work/new" HEAD
for v in old new; do
  cp "$here/cmp_test.go.txt" "$work/$v/tier/cmp_test.go"
  (cd "$work/$v" && go test -c -o "$work/$v.test" ./tier)
done
cd "$work/new/tier"
for r in $(seq 1 "$rounds"); do
  for v in old new; do
    echo "== round $r $v"
    if [ $v = old ]; then export CMP_OLD=1; else unset CMP_OLD; fi
    "$work/$v.test" -test.run '^$' -test.bench "$bench" -test.benchtime "$benchtime" 2>&1 | grep -E '^Benchmark' | sed "s/^/$v /"
  done
done | tee "$work/log"
python3 "$here/table.py" "$work/log"
