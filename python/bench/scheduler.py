#!/usr/bin/python3
"""The reference problem's scenario, measured: a Python scheduler thread that is busy in pure Python
for a step at a time and, each step, asks whether ~1,024 keys exist and collects the answers.

Designs, run side by side in one process (interleaved rounds, medians reported):

  tier-uring, tier-sync   uringtier.Tier.lookup() + poll() on the scheduler thread, io_uring or
                          sync engine: nothing else runs Python
  a-exists-thread         a Python lookup thread calling os.path.exists per path (the starving
                          design the reference started from)
  b-cloop-thread          a Python lookup thread calling a C loop of access() through ctypes with
                          the GIL released for the batch (the merged design; access_loop.c)
  c-batch-exists-thread   as b, with uringtier.batch_exists (the one-line switch)

Per design: keys answered per second, the latency from submit to the answer being seen by the
scheduler (p50/p99 in steps and ms), the scheduler's time per step inside the library (submit +
collect: the tier's calls, or the queue put and drain of the thread designs), and the step's length.

Usage (as root for --fuse-latency; the library built by `make python`):

    /usr/bin/python3 python/bench/scheduler.py                       # warm page cache
    /usr/bin/python3 python/bench/scheduler.py --fuse-latency 1ms    # a FUSE mount adding 1 ms per op
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import uringtier  # noqa: E402

NAMESPACE = "bench"
BLOCK = 4096


def busy(n: int) -> int:
    """A fixed amount of pure-Python work, holding the GIL as a scheduler step does. It is work,
    not time: a step that loses the GIL to another thread takes longer."""
    x = 0
    for i in range(n):
        x += i & 7
    return x


def calibrate(seconds: float) -> int:
    """The busy() count that takes seconds on this machine with nothing else running Python."""
    n = 100_000
    while True:
        t = min(timed(busy, n) for _ in range(5))
        if t > 0.002:
            return round(n * seconds / t)
        n *= 2


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def key(i: int) -> bytes:
    return hashlib.sha256(b"bench-%d" % i).digest()


def block_path(ns_dir: str, k: bytes) -> str:
    """The tier's file for key k (blockstore.FanoutLayout: aa/bb/<hex>.blk), as a server's own path
    mapping would compute it."""
    h = k.hex()
    return f"{ns_dir}/{h[:2]}/{h[2:4]}/{h}.blk"


# Designs. Each has submit(req, batch) and collect() -> [(req, answered keys)], called on the
# scheduler thread, and close().


class TierDesign:
    def __init__(self, root: str, engine: str, keys: int, packed: bool = False) -> None:
        # The lookup cache off: the steps cycle through the data set's batches, and with the cache
        # the tier would answer a batch asked again within a second from memory (two thirds of its
        # answers at 1,024 keys a step), where the thread designs ask the filesystem every time.
        self.tier = uringtier.Tier(root, BLOCK, namespace=NAMESPACE, engine=engine, lookup_timeout=30,
                                   batch_max=max(4096, keys), cache_ttl=0)
        self.name = f"tier-{engine}" + ("-packed" if packed else "")
        self.packed = packed

    def submit(self, req: int, batch: "Batch") -> bool:
        try:
            if self.packed:  # the keys as one bytes object of 32-byte digests
                self.tier.lookup(req, batch.packed, key_size=32)
            else:  # a list of bytes
                self.tier.lookup(req, batch.keys)
        except uringtier.BusyError:
            return False
        return True

    def collect(self) -> list[tuple[int, int]]:
        return [(r.req, len(r)) for r in self.tier.poll()]

    def answered(self, seen: int) -> int:
        return seen

    def close(self) -> None:
        self.tier.close()  # what is in flight ends canceled


class ThreadDesign:
    """A lookup thread fed through a queue, answering through another: the reference's design."""

    def __init__(self, name: str, lookup) -> None:
        self.name = name
        # lookup(batch, progress) -> list of answers, run on the lookup thread; it calls
        # progress(n) as it answers n more keys.
        self.lookup = lookup
        self.done = 0  # keys answered by the lookup thread, also those of a batch not yet seen
        self.inq: queue.SimpleQueue = queue.SimpleQueue()
        self.outq: queue.SimpleQueue = queue.SimpleQueue()
        self.stopping = False  # set by close: skip the batches still queued
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while True:
            item = self.inq.get()
            if item is None:
                return
            if self.stopping:
                continue
            req, batch = item
            self.outq.put((req, self.lookup(batch, self.progress)))

    def progress(self, n: int) -> None:
        self.done += n

    def submit(self, req: int, batch: "Batch") -> bool:
        self.inq.put((req, batch))
        return True

    def collect(self) -> list[tuple[int, int]]:
        out = []
        while True:
            try:
                req, answers = self.outq.get_nowait()
            except queue.Empty:
                return out
            out.append((req, len(answers)))

    def answered(self, seen: int) -> int:
        """Keys answered: on a slow filesystem a batch takes seconds, so the keys the lookup
        thread answered in a batch not finished yet count too (as the tier's whole batches do
        not): the comparison favours the thread designs."""
        return self.done

    def close(self) -> None:
        """Ends the thread once its current batch is done, so that it cannot disturb the next
        design's measurement."""
        self.stopping = True
        self.inq.put(None)
        self.thread.join(timeout=600)


class Batch:
    """One step's question: keys for the tier, the same blocks' paths for the thread designs."""

    __slots__ = ("keys", "packed", "paths")

    def __init__(self, keys: list[bytes], paths: list[str]) -> None:
        self.keys = keys
        self.packed = b"".join(keys)
        self.paths = paths


def build_cloop(dir: str):
    so = os.path.join(dir, "access_loop.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so, os.path.join(HERE, "access_loop.c")], check=True)
    fn = ctypes.CDLL(so).batch_access  # CDLL: the GIL is released during the call
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_size_t

    def lookup(batch: Batch, progress) -> list[bool]:
        blob = b"\0".join(p.encode() for p in batch.paths) + b"\0"
        out = (ctypes.c_uint8 * len(batch.paths))()
        fn(blob, len(batch.paths), out)
        progress(len(batch.paths))
        return [b == 1 for b in bytes(out)]

    return lookup


def run_design(design, batches: list[Batch], work: int, seconds: float, backlog_max: int) -> dict:
    inside: list[float] = []
    inside_cpu: list[float] = []
    lengths: list[float] = []
    lat_steps: list[int] = []
    lat_ms: list[float] = []
    pending: dict[int, tuple[int, float]] = {}
    answered = asked = refused = 0
    req = 0
    start = time.perf_counter()
    s = 0
    while time.perf_counter() - start < seconds:
        t_step = time.perf_counter()
        busy(work)
        batch = batches[s % len(batches)]
        c0 = time.thread_time()
        t0 = time.perf_counter()
        if len(pending) < backlog_max and design.submit(req, batch):
            pending[req] = (s, t0)
            asked += len(batch.keys)
            req += 1
        else:
            refused += 1
        got = design.collect()
        t1 = time.perf_counter()
        inside_cpu.append(time.thread_time() - c0)
        inside.append(t1 - t0)
        for r, n in got:
            s0, ts = pending.pop(r)
            answered += n
            lat_steps.append(s - s0)
            lat_ms.append((t1 - ts) * 1e3)
        lengths.append(time.perf_counter() - t_step)
        s += 1
    elapsed = time.perf_counter() - start
    answered = design.answered(answered)
    return {
        "design": design.name,
        "steps": s,
        "keys_asked": asked,
        "keys_answered": answered,
        "keys_per_sec": answered / elapsed,
        "steps_refused": refused,
        "latency_steps_p50": pct(lat_steps, 0.5),
        "latency_steps_p99": pct(lat_steps, 0.99),
        "latency_ms_p50": pct(lat_ms, 0.5),
        "latency_ms_p99": pct(lat_ms, 0.99),
        "inside_us_p50": pct(inside, 0.5) * 1e6,
        "inside_us_p99": pct(inside, 0.99) * 1e6,
        "inside_cpu_us_p50": pct(inside_cpu, 0.5) * 1e6,
        "step_ms_p50": pct(lengths, 0.5) * 1e3,
        "step_ms_p99": pct(lengths, 0.99) * 1e3,
    }


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def populate(root: str, n: int) -> None:
    with uringtier.Tier(root, BLOCK, namespace=NAMESPACE, engine="sync") as t:
        payload = bytes(BLOCK)
        for lo in range(0, n, 1024):
            ks = [key(i) for i in range(lo, min(n, lo + 1024))]
            t.store(lo, ks, [payload] * len(ks))
            while not t.poll():
                time.sleep(0.001)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-ms", type=float, default=10, help="pure-Python work per scheduler step")
    ap.add_argument("--keys", type=int, default=1024, help="keys asked per step")
    ap.add_argument("--seconds", type=float, default=5, help="per design and round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--blocks", type=int, default=16384, help="blocks stored; half the keys asked exist")
    ap.add_argument("--backlog", type=int, default=32, help="batches in flight before the scheduler stops asking")
    ap.add_argument("--fuse-latency", default="", help="serve the directory through faultfs adding this per op")
    ap.add_argument("--designs", default="tier-uring,tier-uring-packed,tier-sync,a-exists-thread,b-cloop-thread,"
                    "c-batch-exists-thread")
    ap.add_argument("--json", action="store_true", help="print one JSON object per design and round")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="uringtier-bench-")
    mount = None
    try:
        backing = os.path.join(work, "data")
        os.mkdir(backing)
        populate(backing, args.blocks)
        root = backing
        if args.fuse_latency:
            exe = os.path.join(work, "faultmount")
            repo = os.path.dirname(os.path.dirname(HERE))
            subprocess.run(["go", "build", "-o", exe, "./capi/internal/faultmount"], cwd=repo, check=True)
            root = os.path.join(work, "mnt")
            os.mkdir(root)
            mount = subprocess.Popen([exe, backing, root], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1)
            if mount.stdout.readline().strip() != "ready":
                sys.exit("faultmount failed (needs root and /dev/fuse)")
            mount.stdin.write(f"latency {args.fuse_latency}\n")
            mount.stdin.flush()
            assert mount.stdout.readline().startswith("ok")
        ns_dir = os.path.join(root, NAMESPACE)
        # Each step asks about one batch of keys, half stored, half not; the steps cycle through
        # the batches (a data set of --blocks stored blocks makes 2 × blocks / keys of them).
        batches = []
        for b in range(max(1, args.blocks // (args.keys // 2))):
            ks = []
            for j in range(args.keys):
                i = b * (args.keys // 2) + j // 2 if j % 2 == 0 else 10**9 + b * args.keys + j
                ks.append(key(i))
            batches.append(Batch(ks, [block_path(ns_dir, k) for k in ks]))
        assert os.path.exists(batches[0].paths[0]) and not os.path.exists(batches[0].paths[1]), "path mapping"
        cloop_lookup = build_cloop(work)
        def exists_lookup(batch: Batch, progress) -> list[bool]:
            answers = uringtier.batch_exists(batch.paths, timeout=30)
            progress(len(answers))
            return answers

        def python_lookup(batch: Batch, progress) -> list[bool]:
            answers = []
            for p in batch.paths:
                answers.append(os.path.exists(p))
                progress(1)
            return answers

        makers = {
            "tier-uring": lambda: TierDesign(root, "uring", args.keys),
            "tier-uring-packed": lambda: TierDesign(root, "uring", args.keys, packed=True),
            "tier-sync": lambda: TierDesign(root, "sync", args.keys),
            "a-exists-thread": lambda: ThreadDesign("a-exists-thread", python_lookup),
            "b-cloop-thread": lambda: ThreadDesign("b-cloop-thread", cloop_lookup),
            "c-batch-exists-thread": lambda: ThreadDesign("c-batch-exists-thread", exists_lookup),
        }
        names = args.designs.split(",")
        if not args.fuse_latency:  # warm the dentry and inode caches: every path once
            for batch in batches:
                cloop_lookup(batch, lambda n: None)
        work_per_step = calibrate(args.step_ms / 1e3)
        rows: dict[str, list[dict]] = {n: [] for n in names}
        load = os.getloadavg()
        for rnd in range(args.rounds):
            for name in names:
                design = makers[name]()
                row = run_design(design, batches, work_per_step, args.seconds, args.backlog)
                design.close()
                row["round"] = rnd
                rows[name].append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
                else:
                    print(f"round {rnd} {name}: {row['keys_per_sec']:,.0f} keys/s", file=sys.stderr, flush=True)
        report(args, rows, load)
    finally:
        if mount is not None:
            mount.stdin.close()
            mount.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


def report(args, rows: dict[str, list[dict]], load: tuple[float, float, float]) -> None:
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], (int, float))}
           for n, rs in rows.items()}
    where = f"faultfs +{args.fuse_latency}/op" if args.fuse_latency else "warm page cache"
    print(f"\n{args.keys} keys/step, {args.step_ms:g} ms of Python work/step, {args.seconds:g} s x {args.rounds} rounds, "
          f"{where}, load average before {load[0]:.2f}; medians of rounds\n")
    print("| design | keys/s | answer p50 | answer p99 | in library p50 | p99 | CPU p50 | step p50 | step p99 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, m in med.items():
        print(f"| {n} | {m['keys_per_sec']:,.0f} | {m['latency_steps_p50']:g} steps, {m['latency_ms_p50']:,.1f} ms"
              f" | {m['latency_steps_p99']:g} steps, {m['latency_ms_p99']:,.1f} ms"
              f" | {m['inside_us_p50']:,.0f} µs | {m['inside_us_p99']:,.0f} µs | {m['inside_cpu_us_p50']:,.0f} µs"
              f" | {m['step_ms_p50']:.2f} ms | {m['step_ms_p99']:.2f} ms |")
    for base in ("a-exists-thread", "b-cloop-thread", "c-batch-exists-thread"):
        if base in med and "tier-uring" in med:
            ratios = [t["keys_per_sec"] / max(b["keys_per_sec"], 1e-9) for t, b in zip(rows["tier-uring"], rows[base])]
            print(f"\ntier-uring / {base}: {statistics.median(ratios):,.1f}x keys/s (per round: "
                  + ", ".join(f"{r:,.1f}x" for r in ratios) + ")", end="")
    print()


if __name__ == "__main__":
    main()
