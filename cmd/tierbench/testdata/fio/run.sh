#!/usr/bin/env bash
# The tier's 2 MiB O_DIRECT stores and loads against fio's, interleaved, on ext4 over a loop device
# whose backing file is in /dev/shm (a device without the bursts of this VM's disk): per round,
# fio writing a new 2 MiB file each at depth 16 and `tierbench store --direct --depth 16 --batch 1`
# (2 GiB each; fio first in even rounds, the tier first in odd ones),
# and fio's random 2 MiB reads of a 1 GiB file at depth 32 then `tierbench load --direct --depth 32
# --batch 1 --hit-ratio 1` over 512 blocks; then each ratio to fio per round and at the median.
# Every TIERBENCH given (default: one built from this tree) runs in each round, for A/B comparisons,
# a different one first each round (on this device a binary's ratio moved with its place in the round).
# Root, fio (apt-get install fio), about 9 GiB of memory.
# usage: bash cmd/tierbench/testdata/fio/run.sh [ROUNDS=5] [TIERBENCH...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(git -C "$here" rev-parse --show-toplevel)
rounds=${1:-5}
shift || true
work=$(mktemp -d)
img=$(mktemp -u /dev/shm/uringtier-fio.XXXXXX)
mnt=$work/mnt
dev=
cleanup() {
  mountpoint -q "$mnt" && umount "$mnt"
  [ -n "$dev" ] && losetup -d "$dev"
  rm -rf "$work" "$img"
}
trap cleanup EXIT
bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
  (cd "$top" && go build -o "$work/tierbench" ./cmd/tierbench)
  bins=("$work/tierbench")
fi
# Every page of the image written before mkfs: the first write to a page of /dev/shm costs this
# VM far more than the IO, and a run that wrote more fresh pages than another measured that
# (stores 0.33-1.18x fio from one round to the next on a sparse image).
dd if=/dev/zero of="$img" bs=4M count=2048 status=none
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,nodiscard "$img" # no zeroing behind the runs, no holes punched
dev=$(losetup -f --show --direct-io=on "$img")
mkdir -p "$mnt"
mount -o nodiscard "$dev" "$mnt"

gbps() { # fio's JSON on stdin: the bytes a second of its $1 (read or write), in GB/s
  python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["jobs"][0][sys.argv[1]]["bw_bytes"]/1e9))' "$1"
}
tier() { # tierbench's JSON on stdin: "GB/s cpu-µs-a-key" of its $1 workload
  python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if r.get("type") == "result" and r.get("workload") == sys.argv[1]:
        print("%.3f %.0f" % (r["bytes_per_sec"] / 1e9, r["cpu_us_per_key"]))' "$1"
}
# Round 0 is not counted: a warm-up of the device, the file system and the page tables.
out=$work/results.txt
fio_store() {
  mkdir -p "$mnt/fio"
  echo "$r fio store $(fio --name=files --directory="$mnt/fio" --nrfiles=1024 --filesize=2M --openfiles=16 \
    --file_service_type=sequential --create_on_open=1 --fallocate=none --rw=write --bs=2M --direct=1 --iodepth=16 \
    --ioengine=io_uring --output-format=json | gbps write)" | tee -a "$out"
  rm -rf "$mnt/fio"
}
turns() { # the indexes of bins, from round r's first
  local k
  for k in "${!bins[@]}"; do echo $(((k + r) % ${#bins[@]})); done
}
tier_stores() { # 2 GiB each, as fio writes
  for i in $(turns); do
    rm -rf "$mnt/tb"
    "${bins[$i]}" populate --dir "$mnt/tb" --block-size 2MiB --blocks 16 >/dev/null
    echo "$r $i store $("${bins[$i]}" store --dir "$mnt/tb" --engine uring --direct --depth 16 --batch 1 --keys 1024 --json | tier store)" | tee -a "$out"
  done
  rm -rf "$mnt/tb"
}
for r in $(seq 0 "$rounds"); do
  rm -rf "${mnt:?}"/*
  if [ $((r % 2)) = 0 ]; then # fio first in even rounds, last in odd ones: no side gains from going first
    fio_store; tier_stores
  else
    tier_stores; fio_store
  fi
  rm -rf "${mnt:?}"/*; mkdir -p "$mnt/fio"
  echo "$r fio load $(fio --name=big --filename="$mnt/fio/big" --size=1G --rw=randread --bs=2M --direct=1 --iodepth=32 \
    --ioengine=io_uring --time_based --runtime=3 --output-format=json | gbps read)" | tee -a "$out"
  rm -rf "$mnt/fio"
  "${bins[0]}" populate --dir "$mnt/tb" --block-size 2MiB --blocks 512 >/dev/null
  for i in $(turns); do
    echo "$r $i load $("${bins[$i]}" load --dir "$mnt/tb" --engine uring --direct --depth 32 --batch 1 --hit-ratio 1 --duration 3s --json | tier load)" | tee -a "$out"
  done
done
python3 - "$out" "${bins[@]}" <<'PY'
import statistics, sys
fio, tier = {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "0":
        continue
    if f[1] == "fio":
        fio[(f[0], f[2])] = float(f[3])
    else:
        tier.setdefault((int(f[1]), f[2]), []).append((f[0], float(f[3]), float(f[4])))
for (i, w), runs in sorted(tier.items()):
    ratios = [gbps / fio[(r, w)] for r, gbps, _ in runs]
    print(f"{sys.argv[2 + i]} {w}: ÷ fio per round " + " ".join(f"{x:.2f}" for x in ratios)
          + f"; median {statistics.median(ratios):.2f}; cpu/key median {statistics.median(c for _, _, c in runs):.0f} µs")
PY
