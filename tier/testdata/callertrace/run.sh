#!/usr/bin/env bash
# Where the caller's long calls go: BenchmarkCallerFloor with its caller kept on CPU 0 and every
# Lookup, Store, Load and Poll call stamped (URINGTIER_CALLER_TRACE), under `perf record` of that CPU's
# timer, IPI and reschedule interrupts, wake-ups and context switches on the same clock (and of
# its nanosleep calls, which name the Go runtime's sysmon thread); events.py then sorts the calls
# by what happened on the CPU while they ran. Root, and perf from Debian's linux-perf.
# usage: bash tier/testdata/callertrace/run.sh [ENGINE=uring | SUB=op=store/engine=uring | SUB=op=load/engine=uring] [BENCHTIME=4s] [LONG_US=30]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(git -C "$here" rev-parse --show-toplevel)
sub=${1:-uring} benchtime=${2:-4s} long=${3:-30}
case $sub in *=*) ;; *) sub="engine=$sub" ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$top" && go test -c -o "$work/tier.test" ./tier)
cd "$top/tier"
URINGTIER_CALLER_TRACE="$work/calls.txt" perf record -q -C 0 -k CLOCK_MONOTONIC -o "$work/perf.data" \
  -e irq_vectors:local_timer_entry,irq_vectors:call_function_single_entry,irq_vectors:call_function_entry \
  -e irq_vectors:reschedule_entry,irq_vectors:irq_work_entry,sched:sched_switch,sched:sched_wakeup \
  -e syscalls:sys_enter_nanosleep \
  -- "$work/tier.test" -test.run '^$' -test.bench "BenchmarkCallerFloor/$sub\$" -test.benchtime "$benchtime"
perf script -i "$work/perf.data" -F tid,time,event,trace --ns > "$work/events.txt" 2>/dev/null
python3 "$here/events.py" "$work/calls.txt" "$work/events.txt" "$long"
