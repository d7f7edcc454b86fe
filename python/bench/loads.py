#!/usr/bin/python3
"""Loads from Python into the caller's own memory against loads into the Tier's buffers
(``Tier(buffers=N)``), side by side: interleaved rounds of the same random loads at the same depth,
each design on a tier of its own over one populated directory.

  own    page-aligned buffers of the caller's (an anonymous mmap): the io_uring engine reads each
         block with a vectored read whose pages the kernel pins and unpins read by read
  tier   the Tier's buffers: registered (and from 2 MiB of them on in transparent huge pages, where
         the kernel has them), one read of header, payload and past the end

Per design and round: GB/s of payload loaded and CPU (user + system of the whole process, the
library's threads and the kernel's workers for it included) per load; then the medians and the
ratio tier / own. The loads are O_DIRECT where the filesystem allows it (the tier's default).

Usage (the library built by `make python`):

    /usr/bin/python3 python/bench/loads.py                                # 2 MiB blocks in a temporary directory
    /usr/bin/python3 python/bench/loads.py --block-size 65536 --depth 32 --dir /mnt/nvme/x
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import random
import resource
import select
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import uringtier  # noqa: E402

NAMESPACE = "loads"


def key(i: int) -> bytes:
    return hashlib.sha256(b"load-%d" % i).digest()


def populate(path: str, block_size: int, blocks: int) -> None:
    with uringtier.Tier(path, block_size, namespace=NAMESPACE, engine="uring") as t:
        data = bytearray(os.urandom(block_size))
        for i in range(blocks):
            data[:8] = i.to_bytes(8, "little")
            t.store(i, [key(i)], [data])
            while not t.poll():
                select.select([t.fileno()], [], [], 1)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(t: uringtier.Tier, bufs: list, blocks: int, depth: int, seconds: float, rng: random.Random) -> tuple[float, float]:
    """Keeps depth one-block loads in flight for seconds; returns (GB/s, CPU µs a load)."""
    free = list(range(depth))
    slot: dict[int, int] = {}
    req = done = 0
    c0, t0 = cpu(), time.perf_counter()
    end = t0 + seconds
    while True:
        now = time.perf_counter()
        while free and now < end:
            s = free.pop()
            req += 1
            slot[req] = s
            t.load(req, [key(rng.randrange(blocks))], [bufs[s]])
        if not slot:
            break
        results = t.poll()
        if not results:
            select.select([t.fileno()], [], [], 1)
            continue
        for r in results:
            if r.op != uringtier.Op.LOAD:
                continue
            if r.statuses != [uringtier.Status.LOADED]:
                raise SystemExit(f"load {r.req}: {r}")
            free.append(slot.pop(r.req))
            done += 1
    wall, used = time.perf_counter() - t0, cpu() - c0
    return done * t.block_size / wall / 1e9, used / done * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="directory for the blocks (default: a temporary one, removed after)")
    ap.add_argument("--block-size", type=int, default=2 << 20)
    ap.add_argument("--blocks", type=int, default=512)
    ap.add_argument("--depth", type=int, default=16, help="loads in flight")
    ap.add_argument("--seconds", type=float, default=3.0, help="per design and round")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    path = a.dir or tempfile.mkdtemp(prefix="uringtier-loads-")
    try:
        populate(path, a.block_size, a.blocks)
        own_mem = mmap.mmap(-1, a.depth * a.block_size)
        whole = memoryview(own_mem)
        designs = {
            "own": (uringtier.Tier(path, a.block_size, namespace=NAMESPACE, engine="uring"),
                    [whole[i * a.block_size:(i + 1) * a.block_size] for i in range(a.depth)]),
        }
        t = uringtier.Tier(path, a.block_size, namespace=NAMESPACE, engine="uring", buffers=a.depth)
        designs["tier"] = (t, t.buffers)
        e = t.engine
        print(f"{a.block_size} B blocks, {a.blocks} of them, depth {a.depth}; engine {e.kind}, {e.rings} rings,"
              f" direct={e.direct}, fs {e.fs}")
        rng = random.Random(1)
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in designs}
        for name, (tier, bufs) in designs.items():  # a warm-up round, not counted
            run(tier, bufs, a.blocks, a.depth, min(a.seconds, 1), rng)
        for rnd in range(a.rounds):
            for name, (tier, bufs) in designs.items():
                gbps, us = run(tier, bufs, a.blocks, a.depth, a.seconds, rng)
                got[name].append((gbps, us))
                print(f"round {rnd} {name:4}  {gbps:6.2f} GB/s  {us:7.1f} µs CPU a load", flush=True)
        med = {name: (statistics.median(g for g, _ in v), statistics.median(u for _, u in v)) for name, v in got.items()}
        ratios = [g / o for (g, _), (o, _) in zip(got["tier"], got["own"])]
        cpu_ratios = [u / o for (_, u), (_, o) in zip(got["tier"], got["own"])]
        for name, (g, u) in med.items():
            print(f"median {name:4}  {g:6.2f} GB/s  {u:7.1f} µs CPU a load")
        print(f"tier / own per round: GB/s {' '.join(f'{r:.2f}' for r in ratios)}, median {statistics.median(ratios):.2f};"
              f" CPU a load {' '.join(f'{r:.2f}' for r in cpu_ratios)}, median {statistics.median(cpu_ratios):.2f}")
        for tier, _ in designs.values():
            tier.close()
    finally:
        if not a.dir:
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
