#!/usr/bin/env bash
# The caller's floor beside another process's IO: BenchmarkCallerFloor/engine=none (spins of
# calls' median lengths and of 20 µs, no tier in the process) on the idle machine, then while fio,
# a process of its own, does what the default run's stores and loads do to the device: writes
# each 64 KiB block O_DIRECT into a new file (created and closed by fio's threads), and reads
# 64 KiB blocks O_DIRECT at random. Each two ways: one thread with io_uring at depth 64, and 16
# threads of plain pwrite/pread (as a pool of goroutines or threads does). Writes at WRITE_RATE
# (about what the default run's stores reach), reads as fast as they go. Then the tier's own
# BenchmarkCallerFloor/op=store with TMPDIR=DIR, both engines. Prints each run's p99.9 of the
# calls (engine=none: the call-sized spins, a Poll call's 2.5 µs and a Lookup call's 6 µs in turn;
# until 3660c7e the 2.5 µs ones alone, so its figures before run a little lower) and of the 20 µs
# spins, in µs, and fio's MB/s.
# fio (apt-get install fio), python3, and 5 GiB free on DIR.
# usage: bash tier/testdata/callerfloor/run.sh DIR [ROUNDS=2] [WRITE_RATE=512m] [BENCHTIME=3s]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(git -C "$here" rev-parse --show-toplevel)
dir=${1:?usage: run.sh DIR [ROUNDS] [WRITE_RATE] [BENCHTIME]} rounds=${2:-2} rate=${3:-512m} benchtime=${4:-3s}
work=$(mktemp -d)
data=$(mktemp -d "$dir/callerfloor.XXXXXX")
trap 'rm -rf "$work" "$data"' EXIT
(cd "$top" && go test -c -o "$work/tier.test" ./tier)
fio --name=lay --filename="$data/read" --rw=write --bs=1M --direct=1 --size=1g --output=/dev/null

bench() { # $1: the sub-benchmark; prints "call-p99.9 spin-p99.9"
  (cd "$top/tier" && TMPDIR=$dir "$work/tier.test" -test.run '^$' -test.bench "BenchmarkCallerFloor/$1\$" \
    -test.benchtime "$benchtime") | python3 -c '
import re, sys
for line in sys.stdin:
    m = dict((k, v) for v, k in re.findall(r"([\d.]+) (\S+-p99\.9-µs)", line))
    if m:
        print(m["call-p99.9-µs"], m["spin-p99.9-µs"])'
}
beside() { # $1: a label, then fio's arguments: engine=none while fio runs
  local label=$1
  shift
  fio --name=floor --directory="$data" --bs=64k --direct=1 --time_based --runtime=60 --group_reporting \
    --output-format=json --output="$work/fio.json" "$@" &
  local pid=$!
  sleep 1
  local got
  got=$(bench engine=none)
  kill -INT "$pid"
  wait "$pid" || true
  find "$data" -name "floor.*" -delete
  local mbs
  mbs=$(python3 -c '
import json, sys
s = open(sys.argv[1]).read()  # "fio: terminating on signal 2" first
j = json.loads(s[s.index("{"):])["jobs"][0]
print(round((j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e6))' "$work/fio.json")
  printf '%-44s %8s %8s %8s\n' "$label" $got "$mbs"
}
rate16=$(python3 -c 'import sys; s = sys.argv[1]; u = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:].lower(), 1); print(int(float(s.rstrip("kKmMgG")) * u) // 16)' "$rate")
files=(--rw=write --filesize=64k --create_on_open=1 --file_service_type=sequential --fallocate=none) # a new file a block
for r in $(seq "$rounds"); do
  echo "round $r: p99.9 µs of the calls, of the 20 µs spins; fio MB/s"
  printf '%-44s %8s %8s\n' "engine=none, idle" $(bench engine=none)
  beside "engine=none, fio write io_uring depth 64" "${files[@]}" --nrfiles=48000 --openfiles=64 \
    --ioengine=io_uring --iodepth=64 --rate="$rate"
  beside "engine=none, fio write pwrite 16 threads" "${files[@]}" --nrfiles=3000 --openfiles=1 --alloc-size=262144 \
    --ioengine=psync --numjobs=16 --thread --rate="$rate16"
  beside "engine=none, fio read io_uring depth 64" --rw=randread --filename="$data/read" --size=1g --ioengine=io_uring --iodepth=64
  beside "engine=none, fio read pread 16 threads" --rw=randread --filename="$data/read" --size=1g --ioengine=psync --numjobs=16 --thread
  printf '%-44s %8s %8s\n' "op=store/engine=uring" $(bench op=store/engine=uring)
  printf '%-44s %8s %8s\n' "op=store/engine=sync" $(bench op=store/engine=sync)
done
