"""Sets each traced call (BenchmarkCallerFloor, URINGTIER_CALLER_TRACE) beside the perf events
of its CPU while it ran: per kind of call (L: Lookup, P: Poll), the quantiles of all calls, of
those with no event at all, and of those with only a timer tick; then what the calls longer than
LONG_US held. usage: events.py CALLS EVENTS [LONG_US]"""
import bisect
import collections
import sys


def load_events(path):
    events = []
    for line in open(path):
        parts = line.split()
        if len(parts) < 2:
            continue
        at = int(round(float(parts[0].rstrip(':')) * 1e9))
        name = parts[1].rstrip(':').split(':')[-1]
        if name == 'sched_switch':
            state = line.split('prev_state=')[1].split()[0]
            name = 'switch(prev %s)' % state
        events.append((at, name))
    events.sort()
    return events


def quantiles(ds):
    if not ds:
        return 'none'
    ds = sorted(ds)
    q = lambda p: ds[min(len(ds) - 1, int(p * len(ds)))] / 1000
    return 'n=%d p50=%.1f p99=%.1f p99.9=%.1f max=%.1f us' % (len(ds), q(.5), q(.99), q(.999), q(1))


def main():
    calls = [line.split() for line in open(sys.argv[1])]
    events = load_events(sys.argv[2])
    long_ns = int(float(sys.argv[3] if len(sys.argv) > 3 else 30) * 1000)
    times = [e[0] for e in events]
    ticks = sum(1 for e in events if e[1] == 'local_timer_entry')
    if events:
        span = (events[-1][0] - events[0][0]) / 1e9
        print('timer ticks on CPU 0: %d in %.1f s (%.0f/s)' % (ticks, span, ticks / span))
    for kind in 'LP':
        alld, clean, ticked = [], [], []
        held = collections.Counter()
        for k, a, b in calls:
            if k != kind:
                continue
            a, b = int(a), int(b)
            i, j = bisect.bisect_left(times, a), bisect.bisect_right(times, b)
            names = tuple(sorted(set(events[x][1] for x in range(i, j))))
            alld.append(b - a)
            if not names:
                clean.append(b - a)
            elif names == ('local_timer_entry',):
                ticked.append(b - a)
            if b - a > long_ns:
                held[names] += 1
        print('%s all:         %s' % (kind, quantiles(alld)))
        print('%s no event:    %s' % (kind, quantiles(clean)))
        print('%s a tick only: %s' % (kind, quantiles(ticked)))
        for names, n in held.most_common(6):
            print('  %d calls over %d us held: %s' % (n, long_ns // 1000, ', '.join(names) or 'nothing'))


main()
