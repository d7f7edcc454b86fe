#!/usr/bin/env python3
"""Where tierbench's long Submit and Poll calls went, as the kernel saw them (oscalls.sh runs it).

For each call of LONG_US or more in the Go traces (their regions "submit" and "poll"), it follows the
thread (M) that ran the call through the perf events of every CPU and says what took the time:
  off CPU, preempted by X   the thread was runnable, and the kernel ran X on its CPU
  off CPU, blocked          the thread slept (a futex: a lock or the Go scheduler)
  on CPU, interrupts        hard and soft interrupts on its CPU while it held it
  on CPU, nothing seen      the longest stretch in which nothing at all happened on its CPU: no
                            switch, interrupt, tick or fault. The call ran, or the CPU did not; a
                            Submit or Poll computes for microseconds, so a stretch of hundreds is
                            time the hypervisor took.
and how many page faults the thread took in the call (the trace writer's own, 12 µs or more each on our
VMs, fall in about one traced call in 600: a call lengthened by one fault may be the trace's). Then the
count of calls by what took most.
(Profiling by samples is no help here: perf's cpu-clock at 1 kHz made the loads' p99.9 18.6 ms on
our VMs, against 4.1 ms without.)

usage: oscalls.py EVENTS LONG_US TRACE.txt...
  EVENTS: `perf script -F cpu,tid,time,event,trace --ns` of sched:sched_switch,
  irq_vectors:local_timer_entry, exceptions:page_fault_user, irq:irq_handler_entry and _exit and
  irq:softirq_entry and _exit, recorded with -k CLOCK_MONOTONIC;
  TRACE.txt: `go tool trace -d=parsed` of tierbench --trace files (the same clock).
"""
import bisect
import collections
import re
import sys

from longcalls import long_calls, parse

PERF = re.compile(r"\s*(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)")
SILENT, IRQ = "on CPU, nothing seen", "on CPU, interrupts"


def field(rest, key):
    return rest.split(key + "=")[1].split()[0]


def load_events(path):
    """Every perf event as (ns, cpu, tid, name, rest), in time order."""
    events = []
    for line in open(path):
        m = PERF.match(line)
        if m:
            events.append((int(round(float(m[3]) * 1e9)), int(m[2]), int(m[1]), m[4].split(":")[-1], m[5]))
    events.sort()
    return events


def load_calls(paths, long_ns):
    """The regions of long_ns or more (longcalls.py's), as (start, end, thread, kind, file)."""
    calls = []
    for path in paths:
        for start, end, _, thread, what in long_calls(parse(open(path)), long_ns):
            kind = what.split('"')[1] if '"' in what else what
            calls.append((start, end, int(thread), kind, path.rsplit("/", 1)[-1]))
    return sorted(calls)


def comm(name):
    """A thread's name without its numbers: "kworker", "iou-wrk", "swapper", "tierbench"."""
    return re.sub(r"-\d+$", "", name.split("/")[0]) or name


def explain(events, times, start, end, thread):
    """What took [start, end] of thread: {reason: ns}, and its page faults then."""
    me = str(thread)
    # The thread's CPU at start: where it last switched in or had an event.
    cpu, on = None, True
    for i in range(bisect.bisect_left(times, start) - 1, -1, -1):
        at, c, tid, name, rest = events[i]
        if tid == thread or name == "sched_switch" and field(rest, "next_pid") == me:
            cpu, on = c, not (name == "sched_switch" and field(rest, "prev_pid") == me)
            break
    took, faults = collections.Counter(), 0
    since, last, why, irq = start, start, "off CPU, before the call", None
    for at, c, tid, name, rest in events[bisect.bisect_left(times, start):bisect.bisect_right(times, end)]:
        if name == "page_fault_user" and tid == thread:
            faults += 1
        if name == "sched_switch" and field(rest, "prev_pid") == me:
            if on:
                took[SILENT] = max(took[SILENT], at - last)
            state = field(rest, "prev_state")
            why = "off CPU, preempted by " + comm(field(rest, "next_comm")) if state.startswith("R") else "off CPU, blocked"
            on, since = False, at
        elif name == "sched_switch" and field(rest, "next_pid") == me:
            if not on:
                took[why] += at - since
            on, cpu, last = True, c, at
        elif on and c == cpu:
            took[SILENT] = max(took[SILENT], at - last)
            last = at
            if name in ("irq_handler_entry", "softirq_entry") and irq is None:
                irq = at
            elif name in ("irq_handler_exit", "softirq_exit") and irq is not None:
                took[IRQ] += at - irq
                irq = None
    if on:
        took[SILENT] = max(took[SILENT], end - last)
    else:
        took[why] += end - since
    return took, faults


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    long_ns = float(sys.argv[2]) * 1000
    events = load_events(sys.argv[1])
    times = [e[0] for e in events]
    calls = load_calls(sys.argv[3:], long_ns)
    if not calls:
        print(f"no call of {long_ns / 1000:.0f} µs or more")
        return
    by, durations = collections.Counter(), collections.defaultdict(list)
    for start, end, thread, what, path in calls:
        took, faults = explain(events, times, start, end, thread)
        top = max(took, key=took.get)
        by[top] += 1
        durations[top].append((end - start) / 1000)
        parts = ", ".join(f"{k} {v / 1000:.0f} µs" for k, v in took.most_common() if v >= 1000)
        print(f"{path} {what:6} {(end - start) / 1000:7.0f} µs  thread {thread}: {parts}; page faults {faults}")
    print(f"\n{len(calls)} calls of {long_ns / 1000:.0f} µs or more, by what took most of each:")
    for k, n in by.most_common():
        print(f"  {n:4}  {k} (longest {max(durations[k]):.0f} µs)")


if __name__ == "__main__":
    main()
