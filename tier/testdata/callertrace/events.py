"""Sets each traced call (BenchmarkCallerFloor, URINGTIER_CALLER_TRACE) beside the perf events
of its CPU while it ran: per kind of call (L: Lookup, S: Store, R: Load, P: Poll), the quantiles of all calls, of
those with no event at all, and of those with only a timer tick; then what the calls longer than
LONG_US held. usage: events.py CALLS EVENTS [LONG_US]"""
import bisect
import collections
import re
import sys


def load_events(path):
    """The events of `perf script -F tid,time,event,trace`, as (ns, what). A context switch that
    preempted the running thread (prev_state R) and a wake-up name the thread that ran or woke:
    sysmon (the thread with the most nanosleep calls: the Go runtime's sysmon sleeps 20 us to
    10 ms between rounds), a Go thread, or the kernel thread's name without its number."""
    raw, naps = [], collections.Counter()
    for line in open(path):
        parts = line.split()
        if len(parts) < 3:
            continue
        tid, at, name = parts[0], int(round(float(parts[1].rstrip(':')) * 1e9)), parts[2].rstrip(':').split(':')[-1]
        if name == 'sys_enter_nanosleep':
            naps[tid] += 1
            continue
        raw.append((at, name, line))
    sysmon = naps.most_common(1)[0][0] if naps else None

    def who(pid, comm):
        if pid == sysmon:
            return 'sysmon'
        if comm == 'tier.test':
            return 'a Go thread'
        return re.split(r'[/:0-9-]', comm)[0] or comm

    events = []
    for at, name, line in raw:
        if name == 'sched_switch':
            state = field(line, 'prev_state')
            name = 'switch(prev %s)' % state
            if state.startswith('R'):
                name += ' to ' + who(field(line, 'next_pid'), field(line, 'next_comm'))
        elif name == 'sched_wakeup':
            name = 'wake-up of ' + who(field(line, 'pid'), field(line, 'comm'))
        events.append((at, name))
    events.sort()
    return events


def field(line, key):
    return line.split(key + '=')[1].split()[0]


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
    for kind in 'LSRP':
        alld, clean, ticked = [], [], []
        held, lost = collections.Counter(), collections.Counter()
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
                to = [n.split(' to ')[1] for n in names if n.startswith('switch(prev R')]
                for t in set(to) or ['(none)']:
                    lost[t] += 1
        if not alld:
            continue
        print('%s all:         %s' % (kind, quantiles(alld)))
        print('%s no event:    %s' % (kind, quantiles(clean)))
        print('%s a tick only: %s' % (kind, quantiles(ticked)))
        print('  of %d calls over %d us, the caller lost its CPU to: %s' % (
            sum(held.values()), long_ns // 1000, ', '.join('%s %d' % kv for kv in lost.most_common())))
        for names, n in held.most_common(6):
            print('  %d calls over %d us held: %s' % (n, long_ns // 1000, ', '.join(names) or 'nothing'))


main()
