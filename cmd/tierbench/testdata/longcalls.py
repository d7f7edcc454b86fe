#!/usr/bin/env python3
"""The long Submit and Poll calls of a `tierbench --trace` file, each with what the Go scheduler did
meanwhile: which goroutines ran on which P and thread (M), yielded (runtime.Gosched), parked or
were readied. A call that runs on its thread while nothing happens for a millisecond lost its CPU
outside Go (another thread on that CPU, or the hypervisor).

usage: go tool trace -d=parsed FILE | python3 cmd/tierbench/testdata/longcalls.py [LONG_US=300]
"""
import re
import sys

EVENT = re.compile(r"M=(-?\d+) P=(-?\d+) G=(-?\d+) (\w+) Time=(\d+)(.*)")


def parse(lines):
    """The events of `go tool trace -d=parsed` output, as (ns, M, P, G, kind, rest), in time order."""
    events = []
    for line in lines:
        m = EVENT.match(line)
        if m:
            events.append((int(m[5]), m[1], m[2], m[3], m[4], m[6].strip()))
    return sorted(events)


def long_calls(events, long_ns):
    """The regions (Submit and Poll calls) of long_ns or more, as (start, end, G, M at the start, rest)."""
    begun, calls = {}, []
    for t, m, _, g, kind, rest in events:
        if kind == "RegionBegin":
            begun[g] = (t, m, rest)
        elif kind == "RegionEnd" and g in begun:
            start, thread, what = begun.pop(g)
            if t - start >= long_ns:
                calls.append((start, t, g, thread, what))
    return calls


def main():
    long_ns = float(sys.argv[1] if len(sys.argv) > 1 else 300) * 1000
    events = parse(sys.stdin)
    calls = long_calls(events, long_ns)
    if not calls:
        print(f"no call of {long_ns / 1000:.0f} µs or more")
    for start, end, g, _, what in calls:
        print(f"=== G{g} {what}: {(end - start) / 1000:.0f} µs")
        for t, m, p, eg, kind, rest in events:
            if start - 50_000 <= t <= end + 5_000 and kind not in ("Metric",):
                print(f"{(t - start) / 1000:+9.1f} µs  M={m} P={p} G={eg} {kind} {rest[:120]}")


if __name__ == "__main__":
    main()
