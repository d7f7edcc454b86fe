#!/usr/bin/env bash
# Where tierbench's long Submit and Poll calls went, as the kernel saw them: one measured stretch of
# WORKLOAD on ENGINE with --trace, under `perf record` of every CPU's context switches, interrupts,
# timer ticks and user page faults on the Go trace's clock; oscalls.py then follows the caller's
# thread through each call of LONG_US or more. Root, and perf from Debian's linux-perf.
# usage: bash cmd/tierbench/testdata/oscalls.sh [ENGINE=uring] [WORKLOAD=load] [LONG_US=100] [tierbench flags...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(git -C "$here" rev-parse --show-toplevel)
engine=${1:-uring} workload=${2:-load} long=${3:-100}
shift $(($# < 3 ? $# : 3))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$top" && go build -o "$work/tierbench" ./cmd/tierbench)
perf record -q -a -k CLOCK_MONOTONIC -o "$work/perf.data" \
  -e sched:sched_switch,irq_vectors:local_timer_entry,exceptions:page_fault_user \
  -e irq:irq_handler_entry,irq:irq_handler_exit,irq:softirq_entry,irq:softirq_exit \
  -- "$work/tierbench" --engine "$engine" --workloads "$workload" --rounds 1 --trace "$work/t" "$@"
perf script -i "$work/perf.data" -F cpu,tid,time,event,trace --ns > "$work/events.txt" 2>/dev/null
for f in "$work"/t.*; do
  go tool trace -d=parsed "$f" > "$f.txt"
done
python3 "$here/oscalls.py" "$work/events.txt" "$long" "$work"/t.*.txt
