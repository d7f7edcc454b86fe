"""The Tier on a local directory, on both engines: hits, misses, prefixes, loads, stores, bad input,
close with work in flight, the eventfd."""

from __future__ import annotations

import array
import asyncio
import ctypes
import mmap
import os
import selectors
import time
import unittest
from unittest import mock

import numpy as np

import uringtier
from uringtier import Op, Status

from .support import TempDirTest, collect, key, keys, payload

BLOCK = 16384


class Base(TempDirTest):
    engine = ""

    def open(self, **kw) -> uringtier.Tier:
        kw.setdefault("namespace", f"ns-{self.engine}")
        kw.setdefault("engine", self.engine)
        local = "path" not in kw
        tier = uringtier.Tier(kw.pop("path", self.dir), kw.pop("block_size", BLOCK), **kw)
        self.addCleanup(tier.close)
        self.assertEqual(tier.engine.kind, self.engine)
        if local:
            # A temporary directory is on a local filesystem.
            self.assertEqual(tier.engine.stores_sync, self.engine == "uring")
            self.assertFalse(tier.engine.last_page_apart)
        return tier

    def populate(self, tier: uringtier.Tier, n: int, salt: str = "") -> None:
        """Stores blocks 0..n-1 (keys key(i, salt), payloads payload(i))."""
        bufs = [payload(i, tier.block_size) for i in range(n)]
        tier.store(9_000_000, keys(0, n, salt), bufs)
        r = collect(tier, [9_000_000])[9_000_000]
        self.assertEqual(r.statuses, [Status.STORED] * n)


class Conformance:
    """Tests run once per engine (the subclasses below)."""

    def test_hits_and_misses(self: Base) -> None:
        tier = self.open()
        self.populate(tier, 8)
        tier.lookup(1, keys(0, 16))
        r = collect(tier, [1])[1]
        self.assertEqual((r.req, r.op, len(r), r.prefix, r.held), (1, Op.LOOKUP, 16, 8, 0))
        self.assertEqual(r.statuses, [Status.FOUND] * 8 + [Status.MISSING] * 8)
        self.assertEqual(r.ok, [True] * 8 + [False] * 8)
        self.assertEqual(r.status.count(Status.FOUND), 8)
        # Packed keys: one bytes object or a NumPy array of 32-byte digests.
        tier.lookup(2, b"".join(keys(4, 12)), key_size=32)
        tier.lookup_prefix(3, np.frombuffer(b"".join(keys(0, 10)), dtype=np.uint8).reshape(10, 32), key_size=32)
        got = collect(tier, [2, 3])
        self.assertEqual(got[2].statuses, [Status.FOUND] * 4 + [Status.MISSING] * 4)
        self.assertEqual(got[3].prefix, 8)
        with self.assertRaisesRegex(uringtier.InvalidRequestError, "do not split into keys of 32 bytes"):
            tier.lookup(4, b"x" * 33, key_size=32)

    def test_prefix(self: Base) -> None:
        tier = self.open()
        self.populate(tier, 4)
        # Hits, a miss, then hits again: the prefix stops at the miss.
        ks = keys(0, 3) + [key(100)] + keys(3, 4)
        tier.lookup(1, ks)
        tier.lookup_prefix(2, ks)
        got = collect(tier, [1, 2])
        self.assertEqual(got[1].prefix, 3)
        self.assertEqual(got[1].statuses[3:], [Status.MISSING, Status.FOUND])
        self.assertEqual(got[2].prefix, 3)
        self.assertEqual(got[2].statuses[:4], [Status.FOUND] * 3 + [Status.MISSING])
        self.assertIn(got[2].statuses[4], (Status.FOUND, Status.SKIPPED))

    def test_keys_of_several_sizes(self: Base) -> None:
        tier = self.open()
        ks = [b"k" * 8, b"k" * 33, b"k" * 64]
        tier.store(1, ks, [payload(i, BLOCK) for i in range(3)])
        self.assertEqual(collect(tier, [1])[1].statuses, [Status.STORED] * 3)
        tier.lookup(2, ks + [b"q" * 8])
        self.assertEqual(collect(tier, [2])[2].statuses, [Status.FOUND] * 3 + [Status.MISSING])

    def test_load_into_numpy(self: Base) -> None:
        tier = self.open()
        self.populate(tier, 6)
        # Rows of one pool (a KV cache pool), loaded out of order, and a miss.
        pool = np.zeros((8, BLOCK), dtype=np.uint8)
        rows = [5, 0, 3, 7]
        tier.load(1, [key(0), key(1), key(2), key(99)], [pool[i] for i in rows])
        r = collect(tier, [1])[1]
        self.assertEqual(r.statuses, [Status.LOADED] * 3 + [Status.MISSING])
        self.assertEqual(r.prefix, 3)
        for i, row in enumerate(rows[:3]):
            self.assertEqual(pool[row].tobytes(), payload(i, BLOCK), f"block {i} in row {row}")
        self.assertFalse(pool[[1, 2, 4, 6, 7]].any(), "rows not loaded into stay zero")
        # Other dtypes and shapes of the right size in bytes.
        f32 = np.zeros(BLOCK // 4, dtype=np.float32)
        two_d = np.zeros((16, BLOCK // 16), dtype=np.uint8)
        tier.load(2, keys(3, 5), [f32, two_d])
        self.assertEqual(collect(tier, [2])[2].statuses, [Status.LOADED] * 2)
        self.assertEqual(f32.tobytes(), payload(3, BLOCK))
        self.assertEqual(two_d.tobytes(), payload(4, BLOCK))

    def test_load_into_bytearray_and_friends(self: Base) -> None:
        tier = self.open()
        self.populate(tier, 5)
        ba = bytearray(BLOCK)
        mv = memoryview(bytearray(BLOCK * 2))[BLOCK:]
        arr = array.array("B", bytes(BLOCK))
        aligned = mmap.mmap(-1, BLOCK)  # page-aligned: O_DIRECT where the engine may
        raw = ctypes.create_string_buffer(BLOCK)
        tier.load(1, keys(0, 5), [ba, mv, arr, aligned, (ctypes.addressof(raw), BLOCK)])
        self.assertEqual(collect(tier, [1])[1].statuses, [Status.LOADED] * 5)
        self.assertEqual(bytes(ba), payload(0, BLOCK))
        self.assertEqual(bytes(mv), payload(1, BLOCK))
        self.assertEqual(arr.tobytes(), payload(2, BLOCK))
        self.assertEqual(bytes(aligned), payload(3, BLOCK))
        self.assertEqual(raw.raw, payload(4, BLOCK))
        aligned.close()

    def test_array_interface_and_data_ptr(self: Base) -> None:
        tier = self.open()
        self.populate(tier, 2)
        backing = np.zeros(2 * BLOCK, dtype=np.uint8)

        class ArrayInterface:  # an array library that speaks only __array_interface__
            __array_interface__ = {"data": (backing.ctypes.data, False), "shape": (BLOCK,), "typestr": "|u1",
                                   "version": 3}

        class Tensor:  # a tensor with data_ptr() and nbytes, as PyTorch's
            nbytes = BLOCK

            def data_ptr(self) -> int:
                return backing.ctypes.data + BLOCK

            def is_contiguous(self) -> bool:
                return True

        tier.load(1, keys(0, 2), [ArrayInterface(), Tensor()])
        self.assertEqual(collect(tier, [1])[1].statuses, [Status.LOADED] * 2)
        self.assertEqual(backing[:BLOCK].tobytes(), payload(0, BLOCK))
        self.assertEqual(backing[BLOCK:].tobytes(), payload(1, BLOCK))

    def test_store_then_load_in_a_new_tier(self: Base) -> None:
        # Stores from NumPy, bytes and bytearray; read back by a second Tier (no cache shared).
        # With the lookup cache on, a store of a block known to exist writes nothing.
        tier = self.open(cache_ttl=60)
        src = [np.frombuffer(payload(0, BLOCK), dtype=np.uint8), payload(1, BLOCK), bytearray(payload(2, BLOCK))]
        tier.store(1, keys(0, 3, "rb"), src)
        self.assertEqual(collect(tier, [1])[1].statuses, [Status.STORED] * 3)
        tier.store(2, keys(0, 1, "rb"), [payload(9, BLOCK)])  # already there: nothing written
        self.assertEqual(collect(tier, [2])[2].statuses, [Status.PRESENT])
        tier.close()
        other = self.open()
        out = np.zeros((3, BLOCK), dtype=np.uint8)
        other.load(3, keys(0, 3, "rb"), list(out))
        self.assertEqual(collect(other, [3])[3].statuses, [Status.LOADED] * 3)
        for i in range(3):
            self.assertEqual(out[i].tobytes(), payload(i, BLOCK))

    def test_buffers(self: Base) -> None:
        # The Tier's own buffers: page-aligned memoryviews, stored from and loaded into; with
        # io_uring and O_DIRECT a load is one read, the block's header landing in the page before
        # the buffer (memory of the Tier's); the views stay valid memory after close.
        tier = self.open(buffers=2)
        self.assertEqual([len(b) for b in tier.buffers], [BLOCK, BLOCK])
        addrs = [ctypes.addressof(ctypes.c_char.from_buffer(b)) for b in tier.buffers]
        self.assertEqual([a % 4096 for a in addrs], [0, 0])
        tier.buffers[0][:] = payload(5, BLOCK)
        tier.store(1, [key(5, "buf")], tier.buffers[:1])
        self.assertEqual(collect(tier, [1])[1].statuses, [Status.STORED])
        tier.load(2, [key(5, "buf")], tier.buffers[1:])
        self.assertEqual(collect(tier, [2])[2].statuses, [Status.LOADED])
        self.assertEqual(tier.buffers[1].tobytes(), payload(5, BLOCK))
        e = tier.engine
        if e.kind == "uring" and e.direct and e.inline and not e.loads_sync:
            before = (ctypes.c_char * 4096).from_address(addrs[1] - 4096).raw
            self.assertTrue(key(5, "buf") in before, "the header, naming the key, in front of buffer 1")
        tier.close()
        self.assertEqual(tier.buffers[1].tobytes(), payload(5, BLOCK))
        tier.buffers[1][:4] = b"mine"
        # From 2 MiB of buffers on, they start on a 2 MiB boundary (for transparent huge pages).
        big = self.open(block_size=1 << 20, buffers=2)
        frame0 = ctypes.addressof(ctypes.c_char.from_buffer(big.buffers[0])) - 4096
        self.assertEqual(frame0 % (2 << 20), 0)
        for n, block_size in [(-1, BLOCK), (1, 0), (1.5, BLOCK), (True, BLOCK)]:
            with self.subTest(buffers=n, block_size=block_size):
                with self.assertRaisesRegex(uringtier.InvalidOptionsError, "buffers="):
                    uringtier.Tier(self.dir, block_size, engine=self.engine, buffers=n)
        # A library that gives fewer buffers than asked: the open fails, its handle closed and freed.
        lib, handles = uringtier._lib.load(), []

        def short(handle: int, addrs: object, n: int) -> int:
            handles.append(handle)
            return n - 1

        with mock.patch.object(lib, "ut_buffers", short), mock.patch.object(lib, "ut_free", wraps=lib.ut_free) as free:
            with self.assertRaisesRegex(uringtier.UringTierError, "buffers: 1 of 2"):
                uringtier.Tier(self.dir, BLOCK, engine=self.engine, buffers=2)
            self.assertEqual(len(handles), 1)
            free.assert_any_call(handles[0])

    def test_store_read_back_by_go(self: Base) -> None:
        # Blocks for capi/python_test.go to load through the Go tier after this run and check: 16
        # keys sha256("readback-<i>") with payload(i), in namespace readback-<engine>.
        root = os.environ.get("URINGTIER_READBACK_DIR") or self.dir
        tier = self.open(path=root, namespace=f"readback-{self.engine}", block_size=4096)
        import hashlib
        ks = [hashlib.sha256(f"readback-{i}".encode()).digest() for i in range(16)]
        tier.store(1, ks, [payload(i, 4096) for i in range(16)])
        self.assertEqual(collect(tier, [1])[1].statuses, [Status.STORED] * 16)

    def test_bad_input(self: Base) -> None:
        tier = self.open(depth=2)
        self.populate(tier, 1)
        cases = [
            ("wrong buffer size", lambda: tier.load(1, [key(0)], [bytearray(BLOCK - 1)]),
             uringtier.InvalidRequestError, "buffer 0 is 16383 bytes, the block size is 16384"),
            ("non-buffer", lambda: tier.load(1, [key(0)], [42]), TypeError, "buffer 0: int is not a writable"),
            ("read-only buffer for a load", lambda: tier.load(1, [key(0)], [bytes(BLOCK)]), TypeError,
             "buffer 0: bytes is not a writable"),
            ("non-contiguous", lambda: tier.load(1, [key(0)], [np.zeros(2 * BLOCK, np.uint8)[::2]]), TypeError,
             "not a writable contiguous buffer"),
            ("str for a store", lambda: tier.store(1, [key(0)], ["x" * BLOCK]), TypeError, "buffer 0: str"),
            ("buffers and keys differ", lambda: tier.load(1, keys(0, 2), [bytearray(BLOCK)]),
             uringtier.InvalidRequestError, "2 keys but 1 buffers"),
            ("short key", lambda: tier.lookup(1, [b"abc"]), uringtier.InvalidRequestError, "key 0"),
            ("str key", lambda: tier.lookup(1, ["abcdefgh"]), TypeError, "byte strings"),
            ("one bytes object", lambda: tier.lookup(1, key(0)), TypeError, "sequence of byte strings"),
            ("too many keys", lambda: tier.lookup(1, [key(0)] * 4097), uringtier.InvalidRequestError, "batch_max"),
        ]
        for name, call, exc, message in cases:
            with self.subTest(name):
                with self.assertRaises(exc) as cm:
                    call()
                self.assertIn(message, str(cm.exception))
        self.assertEqual(tier.poll(), [], "a refused request produced a result")
        # Back-pressure and IDs in flight.
        ba = bytearray(BLOCK)
        tier.load(1, [key(0)], [ba])
        with self.assertRaisesRegex(uringtier.InvalidRequestError, "in flight"):
            tier.lookup(1, [key(0)])
        tier.lookup(2, [key(0)])
        with self.assertRaises(uringtier.BusyError):
            tier.lookup(3, [key(0)])
        # A pinned bytearray cannot be resized under the tier until its result is polled.
        with self.assertRaises(BufferError):
            ba.extend(b"x")
        self.assertEqual(set(collect(tier, [1, 2])), {1, 2})
        ba.extend(b"x")
        # Closed.
        tier.close()
        for call in (lambda: tier.lookup(4, [key(0)]), lambda: tier.store(4, [key(0)], [bytes(BLOCK)])):
            with self.assertRaisesRegex(uringtier.ClosedError, "closed"):
                call()

    def test_bad_options(self: Base) -> None:
        for kw, message in [
            ({"block_size": 0}, "BlockSize"),
            ({"engine": "fast"}, "want auto, uring or sync"),
            ({"namespace": "a/b"}, "namespace"),
            ({"colour": "blue"}, 'unknown option "colour"'),
            ({"lookup_timeout": -1}, "negative"),
            ({"batch_max": 0}, "batch_max"),
            ({"lookup_op": "stat x"}, "spaces"),
        ]:
            with self.subTest(kw):
                kw = {"engine": self.engine, "block_size": BLOCK, **kw}
                with self.assertRaises(ValueError) as cm:
                    uringtier.Tier(self.dir, **kw)
                self.assertIn(message, str(cm.exception))
        import pathlib
        with uringtier.Tier(pathlib.Path(self.dir), BLOCK, engine=self.engine, namespace="pathlike") as tier:
            self.assertEqual(tier.path, self.dir)
        with self.assertRaisesRegex(uringtier.OpenError, "not a directory"):
            uringtier.Tier("/proc/version/x", BLOCK, engine=self.engine)

    def test_delete(self: Base) -> None:
        tier = self.open()
        self.populate(tier, 4)
        tier.delete(1, [key(0), key(1), key(99)])
        r = collect(tier, [1])[1]
        self.assertEqual((r.op, len(r), r.prefix, r.held), (Op.DELETE, 3, 2, 0))
        self.assertEqual(r.statuses, [Status.DELETED, Status.DELETED, Status.MISSING])
        self.assertEqual(r.ok, [True, True, False])
        self.assertTrue(Status.DELETED.ok)
        # Gone: a load goes to the filesystem whatever the lookup cache says, and so does a new tier.
        bufs = [bytearray(BLOCK) for _ in range(4)]
        tier.load(2, keys(0, 4), bufs)
        self.assertEqual(collect(tier, [2])[2].statuses, [Status.MISSING] * 2 + [Status.LOADED] * 2)
        self.assertEqual(bytes(bufs[2]), payload(2, BLOCK))
        other = self.open(cache_ttl=0)
        other.lookup(3, keys(0, 4))
        self.assertEqual(collect(other, [3])[3].statuses, [Status.MISSING] * 2 + [Status.FOUND] * 2)
        # Packed keys, and a second delete of the same blocks.
        tier.delete(4, b"".join(keys(1, 3)), key_size=32)
        self.assertEqual(collect(tier, [4])[4].statuses, [Status.MISSING, Status.DELETED])
        stats = tier.stats()
        self.assertEqual(stats["ops"]["delete"]["outcomes"], {"deleted": 3, "missing": 2})
        # Every operation started is counted by the ring that ran it (one entry for the sync engine).
        self.assertEqual(len(stats["ring_ops"]), max(1, tier.engine.rings))
        self.assertGreaterEqual(sum(stats["ring_ops"]), 4 + 4)
        with self.assertRaisesRegex(uringtier.InvalidRequestError, "key 0"):
            tier.delete(5, [b"abc"])

    def test_full(self: Base) -> None:
        # A capacity of 4 raw blocks (a raw block's file is exactly BLOCK bytes), none old enough
        # to evict: stores beyond it are refused before writing.
        tier = self.open(format="raw", capacity=4 * BLOCK, evict_min_age=3600, evict_interval=0.02)
        # Until the evictor has first counted the namespace, a tier on a filesystem fuller than its
        # capacity refuses stores.
        deadline = time.monotonic() + 10
        while (stats := tier.stats())["scans"] < 1:
            self.assertLess(time.monotonic(), deadline, f"never counted: {stats}")
            time.sleep(0.01)
        self.populate(tier, 4)
        while (stats := tier.stats())["usage"] < 4 * BLOCK:
            self.assertLess(time.monotonic(), deadline, f"usage never counted: {stats}")
            time.sleep(0.01)
        self.assertEqual(stats["capacity_limit"], 4 * BLOCK)
        tier.store(1, keys(4, 6), [payload(i, BLOCK) for i in (4, 5)])
        r = collect(tier, [1])[1]
        self.assertEqual((r.op, r.prefix), (Op.STORE, 0))
        self.assertEqual(r.statuses, [Status.FULL] * 2)
        self.assertEqual(r.ok, [False, False])
        self.assertFalse(Status.FULL.ok)
        tier.lookup(2, keys(0, 6))
        self.assertEqual(collect(tier, [2])[2].statuses, [Status.FOUND] * 4 + [Status.MISSING] * 2)
        self.assertEqual(tier.stats()["ops"]["store"]["outcomes"], {"stored": 4, "full": 2})

    def test_capacity_options(self: Base) -> None:
        tier = self.open(capacity=1 << 30, high_watermark=0.75, low_watermark=0.5, evict_min_age=0,
                         evict_interval=0.25, touch_interval=0)
        stats = tier.stats()
        self.assertEqual(stats["capacity_limit"], 1 << 30)
        for name in ("usage", "evictor", "evictor_holder", "evicted", "evicted_bytes", "scans", "scan_blocks",
                     "dirs_rescanned", "touches", "touches_dropped"):
            self.assertIn(name, stats)
        self.open(namespace=f"share-{self.engine}", capacity_share=0.5, touch_interval=30).close()
        for kw, message in [
            ({"capacity": -1}, "Capacity -1"),
            ({"capacity": 1.5}, "want an int"),
            ({"capacity": "1GiB"}, "want an int"),
            ({"capacity": True}, "bool"),
            ({"capacity_share": 1.5}, "CapacityShare 1.5"),
            ({"capacity_share": float("nan")}, "not a finite number"),
            ({"capacity_share": "half"}, "want a number"),
            ({"capacity": 1 << 20, "capacity_share": 0.5}, "want one of"),
            ({"capacity": 1 << 20, "high_watermark": 0.5, "low_watermark": 0.7}, "watermarks low 0.7, high 0.5"),
            ({"capacity": 1 << 20, "high_watermark": float("inf")}, "not a finite number"),
            ({"evict_min_age": -1}, "negative"),
            ({"evict_interval": -0.5}, "negative"),
            ({"touch_interval": -1}, "negative"),
        ]:
            with self.subTest(kw):
                with self.assertRaises(uringtier.InvalidOptionsError) as cm:
                    uringtier.Tier(self.dir, BLOCK, engine=self.engine, namespace="bad", **kw)
                self.assertIn(message, str(cm.exception))

    def test_close_with_work_in_flight(self: Base) -> None:
        tier = self.open()
        self.populate(tier, 64)
        bufs = [bytearray(BLOCK) for _ in range(64)]
        for req in range(16):
            tier.lookup(100 + req, keys(0, 128))
        for req in range(8):
            tier.load(200 + req, keys(req * 8, req * 8 + 8), bufs[req * 8:req * 8 + 8])
        tier.close(timeout=5)
        # Every request still gets exactly one result, after close: done or canceled.
        got = collect(tier, list(range(100, 116)) + list(range(200, 208)))
        for req, r in got.items():
            self.assertEqual(r.held, 0)
            for i, s in enumerate(r.statuses):
                want = (Status.FOUND if i < 64 else Status.MISSING) if r.op == Op.LOOKUP else Status.LOADED
                self.assertIn(s, (want, Status.CANCELED), f"request {req} key {i}")
        self.assertEqual(tier.poll(), [])
        for b in bufs:  # every pin released
            b.extend(b"x")
        with self.assertRaises(uringtier.ClosedError):
            tier.lookup(1, [key(0)])

    def test_eventfd_wakes_a_selector(self: Base) -> None:
        tier = self.open()
        self.populate(tier, 1)
        with selectors.DefaultSelector() as sel:
            sel.register(tier.fileno(), selectors.EVENT_READ, "tier")
            # The library turns a published Result into an eventfd write on a thread of its own,
            # so populate's poll may take its Result before that write: readiness is a hint
            # (ut_fd). Such a write comes at most once and carries no result; after it, nothing.
            if sel.select(0.2):
                self.assertEqual(tier.poll(), [], "a Result with nothing submitted")
            self.assertEqual(sel.select(0), [], "readable with nothing submitted")
            for req in (1, 2):
                start = time.monotonic()
                tier.lookup(req, [key(0)])
                events = sel.select(5)
                self.assertEqual([k.data for k, _ in events], ["tier"], f"request {req}: no wake-up")
                self.assertLess(time.monotonic() - start, 1)
                results = tier.poll()
                self.assertEqual([(r.req, r.statuses) for r in results], [(req, [Status.FOUND])])
                self.assertEqual(sel.select(0), [], "still readable after poll")

    def test_eventfd_wakes_asyncio(self: Base) -> None:
        tier = self.open()
        self.populate(tier, 1)

        async def lookup() -> uringtier.Result:
            loop = asyncio.get_running_loop()
            ready = asyncio.Event()
            loop.add_reader(tier.fileno(), ready.set)
            try:
                tier.lookup(1, [key(0)])
                while True:
                    await asyncio.wait_for(ready.wait(), 5)
                    ready.clear()
                    for r in tier.poll():
                        return r
            finally:
                loop.remove_reader(tier.fileno())

        r = asyncio.run(lookup())
        self.assertEqual((r.req, r.statuses), (1, [Status.FOUND]))

    def test_cancel_and_stats(self: Base) -> None:
        tier = self.open()
        self.assertFalse(tier.cancel(12345))
        self.populate(tier, 4)
        tier.lookup(1, keys(0, 8))
        collect(tier, [1])
        stats = tier.stats()
        self.assertEqual(stats["engine"]["kind"], self.engine)
        self.assertEqual(stats["ops"]["lookup"]["outcomes"], {"found": 4, "missing": 4})
        self.assertEqual(stats["ops"]["store"]["outcomes"], {"stored": 4})
        gauges = tier.gauges()
        self.assertEqual(gauges, uringtier.Gauges(0, 0, 0, 0, False), "every result is polled")
        self.assertEqual((gauges.in_flight, gauges.queued), (stats["in_flight"], stats["queued"]))

    def test_poll_limits(self: Base) -> None:
        tier = self.open()
        for req in range(10):
            tier.lookup(req, [key(req)])
        got: list[uringtier.Result] = []
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            batch = tier.poll(max_results=3)
            self.assertLessEqual(len(batch), 3)
            got += batch
        self.assertEqual(sorted(r.req for r in got), list(range(10)))


class SyncEngine(Conformance, Base):
    engine = "sync"


class URingEngine(Conformance, Base):
    engine = "uring"


if __name__ == "__main__":
    unittest.main()
