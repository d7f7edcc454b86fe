"""A hung filesystem (faultfs, FUSE): keys time out while the scheduler's loop keeps its step time,
close returns with buffers still held and releases them later, batch_exists keeps its deadline."""

from __future__ import annotations

import statistics
import time
import unittest

import uringtier
from uringtier import Op, Status

from .support import ENGINES, FaultMount, collect, keys, payload

BLOCK = 4096


def busy(seconds: float) -> None:
    """Pure-Python work that holds the GIL, as a scheduler step does."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


class HungFilesystem(unittest.TestCase):
    def setUp(self) -> None:
        self.fs = FaultMount(self)
        self.addCleanup(self.fs.close)
        self.addCleanup(self.fs.cmd, "reset")  # cleanups run last-in first-out: release before unmounting

    def open(self, engine: str, **kw) -> uringtier.Tier:
        """Opens a tier on the mount, and waits for one lookup to be answered, so that the engine is
        running before the test hangs the filesystem. Open does IO (it creates the namespace
        directory), and the sync engine's owner opens the namespace directory only after Open has
        returned: a hang in that window hangs the owner, and no deadline fires (a tier issue)."""
        tier = uringtier.Tier(self.fs.mountpoint, BLOCK, namespace=f"hung-{engine}", engine=engine, **kw)
        self.addCleanup(tier.close, 10)
        tier.lookup(1 << 63, keys(0, 1, "warm-up"))
        collect(tier, [1 << 63])
        return tier

    def each_engine(self, run) -> None:
        for engine in ENGINES:
            with self.subTest(engine=engine):
                try:
                    run(engine)
                finally:
                    self.fs.cmd("reset")

    def test_lookups_time_out_while_the_scheduler_keeps_its_step(self) -> None:
        self.each_engine(self.run_scheduler)

    def run_scheduler(self, engine: str) -> None:
        # A scheduler loop of 5 ms steps submits 64 lookups a step into a filesystem that answers
        # none; each key times out after 1 s. Blocking anywhere would cost a step 1 s (or forever);
        # the bounds below leave room for preemption on a loaded 2-CPU machine, nothing more.
        timeout = 1.0
        tier = self.open(engine, lookup_timeout=timeout)
        rule = self.fs.cmd("hang lookup,getattr")
        step, steps, batch = 0.005, 300, 64
        inside: list[float] = []  # seconds per step spent in the library
        lengths: list[float] = []  # seconds per step
        submitted: dict[int, float] = {}
        answered: dict[int, uringtier.Result] = {}
        latency: list[float] = []
        for s in range(steps):
            start = time.perf_counter()
            busy(step)
            ks = keys(s * batch, (s + 1) * batch, engine)
            t0 = time.perf_counter()
            if s < steps // 2:
                tier.lookup(s, ks)
                submitted[s] = t0
            results = tier.poll()
            t1 = time.perf_counter()
            inside.append(t1 - t0)
            for r in results:
                answered[r.req] = r
                latency.append(t1 - submitted[r.req])
            lengths.append(time.perf_counter() - start)
        self.assertGreater(int(self.fs.cmd(f"fired {rule}")), 0, "the hang never fired")
        answered.update(collect(tier, set(submitted) - set(answered)))
        for req, r in answered.items():
            self.assertEqual(set(r.statuses), {Status.TIMED_OUT}, f"request {req}")
        self.assertGreater(len(latency), steps // 4, "answers arrived only after the loop")
        median = statistics.median
        self.assertLess(max(inside), timeout / 4, f"a step spent {max(inside) * 1e3:.1f} ms in the library")
        self.assertLess(median(inside), 0.002, f"median {median(inside) * 1e6:.0f} us in the library")
        self.assertLess(median(lengths), step + 0.002, f"median step {median(lengths) * 1e3:.2f} ms")
        # Answers arrive at the deadline, not long after it.
        self.assertLess(median(latency), timeout + 0.5, f"median answer after {median(latency):.2f}s")
        self.assertGreater(tier.stats()["ops"]["lookup"]["outcomes"]["timed-out"], 0)

    def test_close_with_held_buffers(self) -> None:
        self.each_engine(self.close_with_held_buffers)

    def close_with_held_buffers(self, engine: str) -> None:
        tier = self.open(engine, io_timeout=0.3)
        ks = keys(0, 4, engine)
        tier.store(1, ks, [payload(i, BLOCK) for i in range(4)])
        self.assertEqual(collect(tier, [1])[1].statuses, [Status.STORED] * 4)
        rule = self.fs.cmd("hang read")
        bufs = [bytearray(BLOCK) for _ in range(4)]
        tier.load(2, ks, bufs)
        deadline = time.monotonic() + 10
        while int(self.fs.cmd("hung")) < 1:  # the kernel is holding a read
            self.assertLess(time.monotonic(), deadline, "no read reached the filesystem")
            time.sleep(0.01)
        self.assertGreaterEqual(tier.gauges().in_flight, 1, "the hung read is not in flight")
        start = time.monotonic()
        with self.assertRaises(uringtier.StuckError):
            tier.close(timeout=0.2)
        self.assertLess(time.monotonic() - start, 2, "close overran its timeout")
        r = collect(tier, [2])[2]
        self.assertGreater(r.held, 0)
        self.assertEqual(tier.gauges().held, r.held)
        self.assertTrue(all(s in (Status.TIMED_OUT, Status.CANCELED) for s in r.statuses), r.statuses)
        with self.assertRaises(BufferError):  # still pinned: the kernel may write into it
            bufs[0].extend(b"x")
        self.assertGreater(int(self.fs.cmd(f"fired {rule}")), 0)
        self.fs.cmd("release")
        released = []
        deadline = time.monotonic() + 10
        while not released:
            self.assertLess(time.monotonic(), deadline, "no release result")
            released = [x for x in tier.poll() if x.op == Op.RELEASE]
            time.sleep(0.01)
        self.assertEqual([x.req for x in released], [2])
        self.assertEqual(tier.gauges(), uringtier.Gauges(0, 0, 0, 0, False))
        for b in bufs:  # unpinned
            b.extend(b"x")

    def test_cancel_while_hung(self) -> None:
        self.each_engine(self.cancel_while_hung)

    def cancel_while_hung(self, engine: str) -> None:
        # A canceled request still gets its one Result: keys the kernel gives up end CANCELED, the
        # rest (a system call in a hung filesystem cannot always be interrupted) at their deadline.
        timeout = 1.0
        tier = self.open(engine, lookup_timeout=timeout)
        self.fs.cmd("hang lookup,getattr")
        start = time.monotonic()
        tier.lookup(1, keys(0, 8, engine))
        self.assertTrue(tier.cancel(1))
        r = collect(tier, [1])[1]
        self.assertLess(time.monotonic() - start, timeout + 1)
        self.assertTrue(set(r.statuses) <= {Status.CANCELED, Status.TIMED_OUT}, r.statuses)
        self.assertFalse(tier.cancel(1), "canceled twice")

    def test_batch_exists_keeps_its_deadline(self) -> None:
        root = self.fs.mountpoint
        with open(f"{self.fs.backing}/present", "w"):
            pass
        paths = [f"{root}/present", f"{root}/absent"] * 50
        self.assertEqual(uringtier.batch_exists(paths[:2]), [True, False])
        rule = self.fs.cmd("hang lookup,getattr")
        start = time.monotonic()
        self.assertEqual(uringtier.batch_status(paths, timeout=0.3), [Status.TIMED_OUT] * 100)
        took = time.monotonic() - start
        self.assertGreaterEqual(took, 0.3)
        self.assertLess(took, 1.0)
        self.assertGreater(int(self.fs.cmd(f"fired {rule}")), 0)
        # With every worker stuck, a second call still keeps its deadline.
        start = time.monotonic()
        self.assertEqual(uringtier.batch_exists(paths[:2], timeout=0.1), [False, False])
        self.assertLess(time.monotonic() - start, 0.5)
        self.fs.cmd("release")
        self.fs.cmd("reset")
        deadline = time.monotonic() + 10
        while uringtier.batch_exists(paths[:2], timeout=1) != [True, False]:  # the workers are free again
            self.assertLess(time.monotonic(), deadline)


if __name__ == "__main__":
    unittest.main()
