"""Helpers shared by the tests: keys, payloads, waiting for results, a faultfs mount."""

from __future__ import annotations

import hashlib
import os
import selectors
import shutil
import subprocess
import tempfile
import time
import unittest

import uringtier

ENGINES = ("sync", "uring")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def key(i: int, salt: str = "") -> bytes:
    """Test key i: a SHA-256 digest, as real keys are hashes."""
    return hashlib.sha256(f"{salt}key-{i}".encode()).digest()


def keys(lo: int, hi: int, salt: str = "") -> list[bytes]:
    return [key(i, salt) for i in range(lo, hi)]


def payload(i: int, size: int) -> bytes:
    """Block i's payload: distinct per block and per offset."""
    seed = hashlib.sha256(f"payload-{i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def collect(tier: uringtier.Tier, reqs, timeout: float = 10.0) -> dict[int, uringtier.Result]:
    """Waits on the tier's eventfd and polls until every request in reqs has its Result (release
    Results are skipped); returns them by request ID. Fails the test at the timeout."""
    want = set(reqs)
    got: dict[int, uringtier.Result] = {}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(tier.fileno(), selectors.EVENT_READ)
        while want - got.keys():
            for r in tier.poll():
                if r.op != uringtier.Op.RELEASE:
                    got[r.req] = r
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no result for requests {sorted(want - got.keys())} in {timeout}s")
            if want - got.keys():
                sel.select(min(left, 0.5))
    return got


class TempDirTest(unittest.TestCase):
    """A test with a fresh directory, removed afterwards."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="uringtier-test-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)


class FaultMount:
    """A faultfs pass-through mount served by the helper capi/internal/faultmount in a child
    process, driven over its standard input. Skips the test where FUSE is unusable."""

    def __init__(self, test: unittest.TestCase) -> None:
        exe = os.environ.get("URINGTIER_FAULTMOUNT")
        if not exe:
            if shutil.which("go") is None:
                test.skipTest("needs URINGTIER_FAULTMOUNT or go to build capi/internal/faultmount")
            exe = os.path.join(tempfile.mkdtemp(prefix="faultmount-"), "faultmount")
            subprocess.run(["go", "build", "-o", exe, "./capi/internal/faultmount"], cwd=REPO, check=True)
        self.backing = tempfile.mkdtemp(prefix="faultfs-backing-")
        self.mountpoint = tempfile.mkdtemp(prefix="faultfs-mnt-")
        # stderr goes to a file: a pipe nobody reads could fill and block the helper.
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [exe, self.backing, self.mountpoint],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            bufsize=1,
        )
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            code = self.proc.wait()
            self.stderr.seek(0)
            err = self.stderr.read()
            if code == 3:
                test.skipTest(f"needs FUSE: {err.strip()}")
            raise RuntimeError(f"faultmount exited {code}: {line} {err}")

    def cmd(self, line: str) -> str:
        """Sends one command; returns what follows "ok", raises on "error"."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"faultmount {line!r}: {answer}")
        return answer[2:].strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.stderr.close()
        shutil.rmtree(self.backing, ignore_errors=True)
        os.rmdir(self.mountpoint)
