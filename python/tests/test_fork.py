"""Fork safety: the library is loaded lazily, and a child forked after loading fails at once.

Each case runs in a fresh interpreter (the test process itself has long loaded the library), with a
timeout, so a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import uringtier

from .support import TempDirTest

PRELUDE = """
import ctypes, hashlib, multiprocessing, os, sys, time
import uringtier
from uringtier import _lib

KEY = hashlib.sha256(b"k").digest()

def maps_library():
    with open("/proc/self/maps") as f:
        return "liburingtier" in f.read()

def use(root):
    # Opens a tier, looks a key up, waits for the answer.
    with uringtier.Tier(root, 4096, namespace="fork", engine=os.environ.get("ENGINE", "auto")) as t:
        t.store(1, [KEY], [bytes(4096)])
        deadline = time.monotonic() + 10
        while not t.poll():
            assert time.monotonic() < deadline, "no result"
            time.sleep(0.001)
        t.lookup(2, [KEY])
        while True:
            for r in t.poll():
                return r.statuses
            assert time.monotonic() < deadline, "no result"
            time.sleep(0.001)

def expect_forked(call):
    start = time.monotonic()
    try:
        call()
    except uringtier.ForkedError as e:
        assert time.monotonic() - start < 1, "slow"
        assert "spawn" in str(e) and "after the fork" in str(e), str(e)
        return
    raise AssertionError("no ForkedError")
"""


class ForkTest(TempDirTest):
    def run_script(self, body: str, timeout: float = 60) -> None:
        script = os.path.join(self.dir, "script.py")
        with open(script, "w") as f:
            f.write(PRELUDE + textwrap.dedent(body))
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(uringtier.__file__)))
        try:
            proc = subprocess.run([sys.executable, script, self.dir], capture_output=True, text=True, timeout=timeout,
                                  env=env)
        except subprocess.TimeoutExpired as e:
            self.fail(f"hung: {e.stdout} {e.stderr}")
        self.assertEqual(proc.returncode, 0, f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
        self.assertIn("done", proc.stdout)

    def test_import_does_not_load(self) -> None:
        self.run_script("""
            assert not _lib.loaded() and not maps_library()
            uringtier.Status.FOUND, uringtier.Tier  # names resolve without loading
            assert not maps_library()
            use(sys.argv[1])
            assert _lib.loaded() and maps_library()
            print("done")
        """)

    def test_fork_before_loading_works(self) -> None:
        # Imported, not loaded: a forked child loads its own copy and works, and so does the parent.
        self.run_script("""
            pid = os.fork()
            if pid == 0:
                try:
                    assert use(sys.argv[1]) == [uringtier.Status.FOUND]
                except BaseException as e:
                    print("child:", repr(e), file=sys.stderr)
                    os._exit(1)
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            assert status == 0, status
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(2) as pool:
                assert pool.map(use, [sys.argv[1]] * 2) == [[uringtier.Status.FOUND]] * 2
            assert use(sys.argv[1]) == [uringtier.Status.FOUND]
            print("done")
        """)

    def test_fork_after_loading_fails_at_once(self) -> None:
        self.run_script("""
            root = sys.argv[1]
            tier = uringtier.Tier(root, 4096, namespace="fork")
            pid = os.fork()
            if pid == 0:
                try:
                    expect_forked(lambda: tier.lookup(1, [KEY]))
                    expect_forked(lambda: tier.poll())
                    expect_forked(lambda: tier.stats())
                    expect_forked(lambda: uringtier.Tier(root, 4096))
                    expect_forked(lambda: uringtier.batch_exists([root]))
                    expect_forked(lambda: tier.close())
                    # The C library refuses too, without entering the Go runtime (UT_EFORK = -7).
                    raw = ctypes.PyDLL(_lib.library_path())
                    assert raw.ut_fd(ctypes.c_uint64(1)) == -7
                    raw.ut_last_error.restype = ctypes.c_char_p
                    assert b"spawn" in raw.ut_last_error(), raw.ut_last_error()
                    del tier  # its finalizer must not hang either
                except BaseException as e:
                    print("child:", repr(e), file=sys.stderr)
                    os._exit(1)
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            assert status == 0, status
            tier.close()
            assert use(root) == [uringtier.Status.FOUND]  # the parent is unaffected
            print("done")
        """)

    def test_multiprocessing_fork_fails_spawn_works(self) -> None:
        self.run_script("""
            def child(root, q):
                try:
                    use(root)
                    q.put("no error")
                except uringtier.ForkedError as e:
                    q.put("ForkedError: " + str(e))

            def spawned(root, q):
                q.put(use(root))

            if __name__ == "__main__":
                root = sys.argv[1]
                use(root)  # loaded in the parent
                ctx = multiprocessing.get_context("fork")
                q = ctx.Queue()
                p = ctx.Process(target=child, args=(root, q))
                p.start()
                answer = q.get(timeout=20)
                p.join(20)
                assert answer.startswith("ForkedError") and "spawn" in answer, answer
                ctx = multiprocessing.get_context("spawn")
                q = ctx.Queue()
                p = ctx.Process(target=spawned, args=(root, q))
                p.start()
                assert q.get(timeout=30) == [uringtier.Status.FOUND]
                p.join(20)
                assert p.exitcode == 0, p.exitcode
                print("done")
        """)


if __name__ == "__main__":
    unittest.main()
