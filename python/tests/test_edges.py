"""The edges of the ABI: request IDs, timeouts and lengths out of range, refused submits, and
ut_close and ut_free from several threads while a hung filesystem holds a close."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import threading
import time
import unittest
from pathlib import Path

import uringtier
from uringtier import Status, _lib

from .support import FaultMount, TempDirTest, collect, keys, payload

BLOCK = 4096


class Timeouts(unittest.TestCase):
    def test_large_timeout_waits(self) -> None:
        """A timeout longer than Go's Duration holds (292 years) waits as long as it takes; it
        once wrapped to an expired deadline, and every path came back TIMED_OUT."""
        self.assertEqual(uringtier.batch_status(["/"], timeout=5), [Status.FOUND])
        self.assertEqual(uringtier.batch_status(["/"], timeout=1e10), [Status.FOUND])
        self.assertEqual(uringtier.batch_status(["/"], timeout=float("inf")), [Status.FOUND])


class RequestIDs(TempDirTest):
    def test_out_of_range_refused(self) -> None:
        """ctypes reduces an integer modulo 2**64: 2**64+7 would come back as request 7."""
        tier = uringtier.Tier(self.dir, BLOCK, engine="sync")
        self.addCleanup(tier.close)
        buf = bytearray(BLOCK)
        for req in (2**64 + 7, -1, 1.0, True, "1"):
            with self.subTest(req=req):
                with self.assertRaises(uringtier.InvalidRequestError):
                    tier.load(req, keys(0, 1), [buf])
                with self.assertRaises(uringtier.InvalidRequestError):
                    tier.lookup(req, keys(0, 1))
        buf.extend(b"x")  # not pinned by the refused loads
        del buf[BLOCK:]
        tier.load(2**64 - 1, keys(0, 1), [buf])
        self.assertEqual(collect(tier, [2**64 - 1])[2**64 - 1].statuses, [Status.MISSING])


class RefusedSubmits(TempDirTest):
    def test_failed_pin_releases_earlier_buffers(self) -> None:
        """A buffer that cannot be pinned (read-only, for a load) leaves the ones before it free."""
        tier = uringtier.Tier(self.dir, BLOCK, engine="sync")
        self.addCleanup(tier.close)
        good = bytearray(BLOCK)
        with self.assertRaises(TypeError):
            tier.load(1, keys(0, 2), [good, bytes(BLOCK)])  # bytes: not writable
        good.extend(b"x")  # BufferError while still exported

    def test_raising_submit_frees_its_id(self) -> None:
        """A submit that raises (an interrupt in the call) leaves neither its pins nor its ID."""
        tier = uringtier.Tier(self.dir, BLOCK, engine="sync")
        self.addCleanup(tier.close)
        real = tier._lib

        class Interrupted:
            def __getattr__(self, name: str):
                return getattr(real, name)

            def ut_load(self, *args):
                raise KeyboardInterrupt

        tier._lib = Interrupted()
        buf = bytearray(BLOCK)
        with self.assertRaises(KeyboardInterrupt):
            tier.load(1, keys(0, 1), [buf])
        tier._lib = real
        buf.extend(b"x")
        del buf[BLOCK:]
        tier.load(1, keys(0, 1), [buf])  # not "already in flight"
        self.assertEqual(collect(tier, [1])[1].statuses, [Status.MISSING])


class ImpossibleLengths(unittest.TestCase):
    def run_c(self, code: str) -> subprocess.CompletedProcess:
        prog = (
            "import ctypes, tempfile\n"
            "from uringtier import _lib\n"
            "lib = _lib.load()\n" + code
        )
        return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)

    def test_poll_huge_results_cap(self) -> None:
        """An impossible length is UT_EARG, not a Go panic that ends the process."""
        p = self.run_c(
            "h = ctypes.c_uint64()\n"
            "assert lib.ut_open(tempfile.mkdtemp().encode(), b'block_size=4096 engine=sync', ctypes.byref(h)) == 0\n"
            "res = (_lib.ut_result * 1)(); st = (ctypes.c_uint8 * 16)()\n"
            "print('rc', lib.ut_poll(h.value, res, 1 << 60, st, 16))\n"
        )
        self.assertEqual(p.returncode, 0, p.stderr[-600:])
        self.assertEqual(p.stdout.split(), ["rc", "-10"], "UT_EARG")

    def test_exists_huge_n(self) -> None:
        p = self.run_c(
            "st = (ctypes.c_uint8 * 1)()\n"
            "print('rc', lib.ut_exists(b'/\\0', 2, (1 << 64) - 1, 1000, st))\n"
        )
        self.assertEqual(p.returncode, 0, p.stderr[-600:])
        self.assertEqual(p.stdout.split(), ["rc", "-10"], "UT_EARG")


class Hung(unittest.TestCase):
    def setUp(self) -> None:
        self.fs = FaultMount(self)
        self.addCleanup(self.fs.close)
        self.addCleanup(self.fs.cmd, "reset")

    def test_close_large_timeout_waits(self) -> None:
        """close(timeout=1e10) waits for a load the filesystem holds for a second; it once
        wrapped to an expired deadline and gave StuckError at once."""
        tier = uringtier.Tier(self.fs.mountpoint, BLOCK, namespace="slow", engine="sync", io_timeout=30)
        self.addCleanup(tier.close, 10)
        ks = keys(0, 1, "slow")
        tier.store(1, ks, [payload(0, BLOCK)])
        self.assertEqual(collect(tier, [1])[1].statuses, [Status.STORED])
        self.fs.cmd("hang read")
        buf = bytearray(BLOCK)
        tier.load(2, ks, [buf])
        deadline = time.monotonic() + 10
        while int(self.fs.cmd("hung")) < 1:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.01)
        timer = threading.Timer(1.0, self.fs.cmd, ["release"])
        timer.start()
        self.addCleanup(timer.join)
        start = time.monotonic()
        tier.close(timeout=1e10)
        self.assertGreater(time.monotonic() - start, 0.5)
        self.assertEqual(collect(tier, [2])[2].statuses, [Status.LOADED])

    def test_close_and_free_keep_to_their_timeouts(self) -> None:
        """ut_close(t, 0) and ut_free(t) while another thread's ut_close(t, 3000) waits for a hung
        filesystem keep to their own waits ("at most timeout_ms"; ut_free "without waiting for
        the filesystem"): both once waited out the first close's timeout."""
        lib = _lib.load()
        tier = uringtier.Tier(self.fs.mountpoint, BLOCK, namespace="free", engine="sync", lookup_timeout=30)
        tier.lookup(1, keys(0, 1, "warm"))
        collect(tier, [1])
        h = tier._handle
        tier._handle = 0  # this test drives the handle through the C ABI below
        self.fs.cmd("hang lookup,getattr")
        data = b"".join(keys(0, 1, "hung"))
        self.assertEqual(lib.ut_lookup(h, 2, data, len(data), None, 1), 0)
        deadline = time.monotonic() + 10
        while int(self.fs.cmd("hung")) < 1:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.01)
        took: dict[str, float] = {}
        rcs: dict[str, int] = {}

        def timed(name: str, fn, *args) -> None:
            t0 = time.monotonic()
            rcs[name] = fn(*args)
            took[name] = time.monotonic() - t0

        closer = threading.Thread(target=timed, args=("ut_close(t, 3000)", lib.ut_close, h, 3000))
        closer.start()
        time.sleep(0.2)
        second = threading.Thread(target=timed, args=("ut_close(t, 0)", lib.ut_close, h, 0))
        second.start()
        time.sleep(0.1)
        freer = threading.Thread(target=timed, args=("ut_free(t)", lib.ut_free, h))
        freer.start()
        for th in (closer, second, freer):
            th.join(10)
        self.assertGreaterEqual(int(self.fs.cmd("hung")), 1, "the lookup was held throughout")
        self.fs.cmd("release")
        slow = {k: round(v, 2) for k, v in took.items() if v > 0.5 and k != "ut_close(t, 3000)"}
        self.assertEqual(slow, {}, "seconds waited behind the first ut_close(t, 3000)")
        self.assertEqual(rcs, {"ut_close(t, 3000)": -6, "ut_close(t, 0)": -6, "ut_free(t)": 0}, "UT_ESTUCK, UT_ESTUCK, UT_OK")
        self.assertGreater(took["ut_close(t, 3000)"], 2.5, "the first close kept to its own timeout")


if __name__ == "__main__":
    unittest.main()


class ErrorCodes(unittest.TestCase):
    def test_every_code_has_its_exception(self) -> None:
        """Each error code of uringtier.h has a message and raises its own exception class; a tier
        whose engine failed once raised OpenError ("could not set up the directory") from a
        submit."""
        header = (Path(__file__).resolve().parents[2] / "capi" / "uringtier.h").read_text()
        enum = header[header.index("enum ut_error {") : header.index("};", header.index("enum ut_error {"))]
        codes = {name: int(value) for name, value in re.findall(r"UT_(E[A-Z]+) = (-\d+)", enum)}
        self.assertIn("EBROKEN", codes)
        lib = _lib.load()
        for name, code in codes.items():
            with self.subTest(code=name):
                self.assertEqual(getattr(_lib, name), code, "the package's constant")
                self.assertNotIn(b"unknown", lib.ut_strerror(code))
                if name != "ERANGE":  # Tier.poll sizes its status array for the largest request
                    self.assertIn(code, _lib._ERRORS)
                    self.assertEqual(lib.error(code).code, code)
        self.assertIsInstance(lib.error(codes["EBROKEN"]), uringtier.BrokenError)
        self.assertNotIsInstance(lib.error(codes["EBROKEN"]), uringtier.OpenError)
