#!/usr/bin/env python3
"""The performance aims, measured side by side in one sitting, each as the ratio the aim names.

Per round, for this tree's build (and, with --old REV, a build of REV, the two in turn, a different
one first each round), it runs:
  lookups  tier's BenchmarkLookup, BenchmarkLookupCold and BenchmarkLookupCached (--benchtime):
           warm lookups of a ring per CPU (lookup op openpath) ÷ the best pool (2 or 16 goroutines
           calling fstatat or faccessat) and ÷ one goroutine calling fstatat, and (no aim) ÷ the
           same op on a bare ring per CPU with no tier around it, and that ÷ the best pool; the same
           again from BenchmarkLookupInterleaved, which times them in turn, a pass over the keys each,
           so that the VM's drift touches them alike (the "interleaved" rows), and there (no aim)
           the bare rings ÷ the best pool making their open as a system call; cold ones ÷ the best
           pool (16 or 64 goroutines); keys a second answered from the lookup cache, and the time
           from submit to result of 8 keys it holds (BenchmarkLookupCachedRoundTrip)
  loads    BenchmarkLoad/size=*/io=buffered: page-cache loads, a ring per CPU ÷ the sync engine; the
           same from BenchmarkLoadInterleaved, the two engines in turn (the "interleaved" rows)
  fuse     linux_test's TestSlowFilesystem (1 ms an operation): the io_uring engine ÷ one thread
           and ÷ a pool of 64
  default  `tierbench --rounds 2 --json` (the default run, each engine first once): per workload
           and round the io_uring engine's keys a second and CPU a key ÷ the sync engine's, its
           callers' p99.9, its longest call ÷ the sync engine's (and, not the aim's figure, its
           longest among as many calls as the sync engine made ÷ the sync engine's longest; and
           each engine's calls of 300 µs or more a million, pooled over every row and round); then
           the same with --interleave 8 (the engines taking turns in 8 slices of each workload, on
           tiers open at once): keys a second and CPU a key ÷ the sync engine's, which the minute-to-
           minute drift of this VM and of /tmp's ext4 (after mass deletes) then touch alike
  mixed    `tierbench mixed --engine all --json`: the io_uring engine's readers' p99, with 1 GiB of
           stores in flight ÷ without, on a fresh ext4 with a journal (a loop device over a file in
           /var/tmp, mounted nodiscard), and, no aim, the same in /tmp after the parts before
  gluster  (with --only) the README's GlusterFS volumes, client caching off and on, each a one-brick
           volume of this machine's glusterd (running): `tierbench run --engine all --rounds 2 --batch
           lookup=128`, the io_uring engine's keys a second ÷ the sync engine's per workload and round
and with --fio, once for all rounds, cmd/tierbench/testdata/fio/run.sh (2 MiB O_DIRECT loads and
stores ÷ fio's; root, fio, 9 GiB of memory).
Then, per aim and build, the median over the rounds, the range, and whether the median meets it.

usage: python3 cmd/tierbench/testdata/aims/run.py [--rounds 3] [--old REV] [--fio] [--only lookups,loads,...,gluster]
Root for the cold lookups (they drop the caches), for FUSE and for the mixed part's loop device; Go;
about 3 minutes a round a build.
"""
import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

TOP = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--show-toplevel"],
                     check=True, capture_output=True, text=True).stdout.strip()
PARTS = ["lookups", "loads", "fuse", "default", "mixed", "gluster"]
DEFAULT_PARTS = PARTS[:-1]  # gluster with --only: it needs glusterd running

# The longest call is one draw of each engine's stalls; how many calls took SLOW_US or more, a
# million calls, over every row of every round, is a steadier figure beside it (no aim of its own).
SLOW_US = 300

# Each aim: (key, what, unit, met(value)); met None: a figure to read, no aim. Ratios are this
# engine's figure ÷ the other's.
AIMS = [
    ("warm_pool", "warm lookups ÷ best pool", "×", lambda v: v >= 0.95),
    ("warm_loop", "warm lookups ÷ one thread", "×", lambda v: v >= 1.5),
    ("warm_ring", "  warm lookups ÷ their op on bare rings", "×", None),
    ("ring_pool", "  their op on bare rings ÷ best pool", "×", None),
    ("warm_pool_il", "interleaved warm lookups ÷ best pool", "×", lambda v: v >= 0.95),
    ("warm_loop_il", "interleaved warm lookups ÷ one thread", "×", lambda v: v >= 1.5),
    ("warm_ring_il", "  interleaved: ÷ their op on bare rings", "×", None),
    ("ring_pool_il", "  interleaved: their op on bare rings ÷ best pool", "×", None),
    ("ring_open_il", "  interleaved: their op on bare rings ÷ its open from a pool", "×", None),
    ("cold_pool", "cold lookups ÷ best pool", "×", lambda v: v >= 1),
    ("cached", "cached lookups, M keys/s", "", lambda v: v >= 10),
    ("cached_sync", "  the same ÷ sync", "×", None),
    ("cached_rt", "  8 cached keys, submit to result, µs", "", None),
    ("fuse_loop", "FUSE 1 ms lookups ÷ one thread", "×", lambda v: v >= 30),
    ("fuse_pool", "FUSE 1 ms lookups ÷ pool of 64", "×", lambda v: v >= 1),
    ("load_64KiB", "page-cache loads 64 KiB ÷ sync", "×", lambda v: v >= 1),
    ("load_256KiB", "page-cache loads 256 KiB ÷ sync", "×", lambda v: v >= 1),
    ("load_2MiB", "page-cache loads 2 MiB ÷ sync", "×", lambda v: v >= 1),
] + [(f"load_{z}_il", f"interleaved page-cache loads {z} ÷ sync", "×", lambda v: v >= 1)
     for z in ("64KiB", "256KiB", "2MiB")] + [
] + [a for w in ("lookup", "load", "store") for a in [
    (f"{w}_rate", f"default run {w}s: keys/s ÷ sync", "×", lambda v: v >= 1),
    (f"{w}_cpu", f"default run {w}s: CPU a key ÷ sync", "×", lambda v: v <= 1),
    (f"{w}_p999", f"default run {w}s: caller p99.9, µs", "", lambda v: v < 50),
    (f"{w}_max", f"default run {w}s: longest call ÷ sync", "×", lambda v: v <= 1),
    (f"{w}_max_eq", f"  the same at the sync engine's call count", "×", lambda v: v <= 1),
    (f"{w}_slow_uring", f"  calls of {SLOW_US} µs or more a million: io_uring", "", None),
    (f"{w}_slow_sync", f"  calls of {SLOW_US} µs or more a million: sync", "", None),
]] + [a for w in ("lookup", "load", "store") for a in [
    (f"{w}_rate_il", f"interleaved {w}s: keys/s ÷ sync", "×", lambda v: v >= 1),
    (f"{w}_cpu_il", f"interleaved {w}s: CPU a key ÷ sync", "×", lambda v: v <= 1),
]] + [
    ("mixed_lookup", "lookups' p99 with stores ÷ without", "×", lambda v: v < 2),
    ("mixed_load", "loads' p99 with stores ÷ without", "×", lambda v: v < 2),
    ("mixed_lookup_tmp", "  lookups' in /tmp", "×", None),
    ("mixed_load_tmp", "  loads' in /tmp", "×", None),
] + [(f"gluster_{c}_{w}", f"GlusterFS, caching {c}: {w}s ÷ sync", "×", lambda v: v >= 1)
       for c in ("off", "on") for w in ("lookup", "load", "store")] + [
    ("fio_load", "O_DIRECT 2 MiB loads ÷ fio", "×", lambda v: v >= 1),
    ("fio_store", "O_DIRECT 2 MiB stores ÷ fio", "×", lambda v: v >= 0.8),
]


def run(args, cwd=None, check=True):
    p = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout


class Build:
    def __init__(self, name, tree, work):
        self.name, self.tree = name, tree
        self.bin = os.path.join(work, name)
        os.makedirs(self.bin)
        print(f"building {name} ({tree})", file=sys.stderr)
        run(["go", "test", "-c", "-o", f"{self.bin}/tier.test", "./tier"], cwd=tree)
        run(["go", "test", "-c", "-o", f"{self.bin}/linux.test", "./linux_test"], cwd=tree)
        run(["go", "build", "-o", f"{self.bin}/tierbench", "./cmd/tierbench"], cwd=tree)

    def bench(self, pattern, benchtime):
        """name (without the -GOMAXPROCS suffix) -> {unit: value} of each benchmark line."""
        out = run([f"{self.bin}/tier.test", "-test.run", "^$", "-test.bench", pattern, "-test.benchtime", benchtime],
                  cwd=os.path.join(self.tree, "tier"))
        rows = {}
        for line in out.splitlines():
            f = line.split()
            if f and f[0].startswith("Benchmark") and len(f) > 3:
                rows[re.sub(r"-\d+$", "", f[0])] = {f[i + 1]: float(f[i]) for i in range(2, len(f) - 1, 2)}
        return rows


def lookups(b, a):
    rows = b.bench("BenchmarkLookup$|BenchmarkLookupCold|BenchmarkLookupCached|BenchmarkLookupInterleaved", a.benchtime)
    warm = lambda e: rows[f"BenchmarkLookup/engine={e}"]["keys/s"]
    pools = [n for n in rows if re.fullmatch(r"BenchmarkLookup/engine=(fstatat|faccessat)-pool\d+", n)]
    uring = warm("uring-openpath/rings=cpus")
    cold = lambda e: rows[f"BenchmarkLookupCold/engine={e}"]["ns/op"]
    cold_pools = [n for n in rows if re.fullmatch(r"BenchmarkLookupCold/engine=fstatat-pool\d+", n)]
    out = {
        "warm_pool": uring / max(rows[n]["keys/s"] for n in pools),
        "warm_loop": uring / warm("fstatat-loop"),
        "cold_pool": min(rows[n]["ns/op"] for n in cold_pools) / cold("uring-openpath"),
        "cached": rows["BenchmarkLookupCached/engine=uring"]["keys/s"] / 1e6,
        "cached_sync": rows["BenchmarkLookupCached/engine=uring"]["keys/s"]
        / rows["BenchmarkLookupCached/engine=sync"]["keys/s"],
    }
    ring = rows.get("BenchmarkLookup/engine=ring-openpath/rings=cpus")
    if ring:  # not in builds before 07bfd82
        out["warm_ring"] = uring / ring["keys/s"]
        out["ring_pool"] = ring["keys/s"] / max(rows[n]["keys/s"] for n in pools)
    il = rows.get("BenchmarkLookupInterleaved")
    if il:  # not in builds before 8e58403
        best = max(v for u, v in il.items() if re.fullmatch(r"(fstatat|faccessat)-pool\d+-keys/s", u))
        out["warm_pool_il"] = il["uring-keys/s"] / best
        out["warm_loop_il"] = il["uring-keys/s"] / il["fstatat-loop-keys/s"]
        out["warm_ring_il"] = il["uring-keys/s"] / il["ring-keys/s"]
        out["ring_pool_il"] = il["ring-keys/s"] / best
        opens = [v for u, v in il.items() if re.fullmatch(r"openpath-pool\d+-keys/s", u)]
        if opens:  # not in builds before this row
            out["ring_open_il"] = il["ring-keys/s"] / max(opens)
    rt = rows.get("BenchmarkLookupCachedRoundTrip/engine=uring")
    if rt:  # not in builds before cf09025
        out["cached_rt"] = rt["ns/op"] / 1e3
    return out


def loads(b, a):
    rows = b.bench("^BenchmarkLoad$/size=(64KiB|256KiB|2MiB)/io=buffered/engine=(uring|sync)$", a.benchtime)
    rows.update(b.bench("^BenchmarkLoadInterleaved$", a.benchtime))
    out = {}
    for size in ("64KiB", "256KiB", "2MiB"):
        base = f"BenchmarkLoad/size={size}/io=buffered/engine="
        out[f"load_{size}"] = rows[base + "uring/rings=cpus"]["MB/s"] / rows[base + "sync"]["MB/s"]
        il = rows.get(f"BenchmarkLoadInterleaved/size={size}")
        if il:  # not in builds before 83815ea
            out[f"load_{size}_il"] = il["uring-keys/s"] / il["sync-keys/s"]
    return out


def fuse(b, a):
    out = run([f"{b.bin}/linux.test", "-test.run", "TestSlowFilesystem$", "-test.v", "-test.count", "1"],
              cwd=os.path.join(b.tree, "linux_test"))
    if "--- SKIP" in out:
        raise RuntimeError("TestSlowFilesystem skipped: " + out[-500:])
    m = re.search(r"uring engine: .*\(([\d.]+)x the statx loop, ([\d.]+)x the pool\)", out)
    if not m:
        raise RuntimeError("no io_uring line in TestSlowFilesystem's log:\n" + out[-1500:])
    return {"fuse_loop": float(m[1]), "fuse_pool": float(m[2])}


def json_lines(out):
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def rounds(out):
    """tierbench --json's result rows: {round: {(workload, engine): row}}."""
    got = {}
    for r in json_lines(out):
        if r.get("type") == "result":
            got.setdefault(r.get("round", 1), {})[(r["workload"], r["engine"])] = r
    return [got[k] for k in sorted(got)]


def default(b, a):
    # Two rounds, each engine first once: on an ext4 without a journal (this VM's /tmp) a store
    # costs more CPU the more files were deleted in the minutes before, so whichever engine went
    # first after the last run's data set was removed would pay for it.
    out, slow = {}, {}
    for rows in rounds(run([f"{b.bin}/tierbench", "--rounds", "2", "--json"], cwd=tempfile.gettempdir())):
        for w in ("lookup", "load", "store"):
            for e in ("uring", "sync"):
                hist = rows[(w, e)]["caller_hist"]
                n = slow.setdefault((w, e), [0, 0])
                n[0] += sum(c for lower, c in hist if lower >= SLOW_US * 1000)
                n[1] += sum(c for _, c in hist)
            u, s = rows[(w, "uring")], rows[(w, "sync")]
            for key, v in ((f"{w}_rate", u["keys_per_sec"] / s["keys_per_sec"]),
                           (f"{w}_cpu", u["cpu_us_per_key"] / s["cpu_us_per_key"]),
                           (f"{w}_p999", u["caller_us"]["p999"]),
                           (f"{w}_max", u["caller_max_us"] / s["caller_max_us"]),
                           (f"{w}_max_eq", longest_at(u["caller_hist"], s["caller_hist"]))):
                out.setdefault(key, []).append(v)
    for (w, e), (n, calls) in slow.items():
        out[f"{w}_slow_{e}_n"], out[f"{w}_slow_{e}_calls"] = [n], [calls]
    # The caller's figures of slices are not the default run's: each slice starts its pipeline anew.
    args = [f"{b.bin}/tierbench", "--rounds", "2", "--interleave", "8", "--json"]
    p = subprocess.run(args, cwd=tempfile.gettempdir(), capture_output=True, text=True)
    if p.returncode == 2 and "interleave" in p.stderr:
        return out  # a build from before --interleave: no such figures
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    for rows in rounds(p.stdout):
        for w in ("lookup", "load", "store"):
            u, s = rows[(w, "uring")], rows[(w, "sync")]
            out.setdefault(f"{w}_rate_il", []).append(u["keys_per_sec"] / s["keys_per_sec"])
            out.setdefault(f"{w}_cpu_il", []).append(u["cpu_us_per_key"] / s["cpu_us_per_key"])
    return out


def longest_at(hist, other):
    """The longest of hist's calls among as many as other holds (tierbench's caller_hist, [lower bound
    in ns, count] pairs): hist's quantile 1 - 1/n(other), ÷ other's longest, bucket by bucket. Not the
    aim's figure: the engine that makes more calls in a row draws its longest from more of them."""
    n, m = sum(c for _, c in hist), sum(c for _, c in other)
    rank, seen = min(n, n - n // m + 1), 0  # n calls hold n/m sets of m: all but the longest set's longest
    for lower, c in hist:
        seen += c
        if seen >= rank:
            return lower / other[-1][0]


def mixed(b, a):
    """The store burst twice: on a fresh ext4 with a journal, mounted nodiscard (the aim's rows), and in
    /tmp as a new user's run would be, after the parts before made and deleted their data sets there
    (on this VM an ext4 without a journal, whose new files then scan the inode tables whichever engine
    makes them: docs/performance.md, eighth sitting)."""
    out = {}
    with fresh_ext4() as mnt:
        out.update(mixed_in(b, f"{mnt}/tb", ""))
    with tempfile.TemporaryDirectory() as d:
        out.update(mixed_in(b, d, "_tmp"))
    return out


def mixed_in(b, d, suffix):
    run([f"{b.bin}/tierbench", "populate", "--dir", d])
    got = json_lines(run([f"{b.bin}/tierbench", "mixed", "--dir", d, "--engine", "all", "--json"]))
    r = next(r for r in got if r.get("type") == "ratio" and r["engine"] == "uring")
    return {f"mixed_lookup{suffix}": r["p99_ratio"]["lookup"], f"mixed_load{suffix}": r["p99_ratio"]["load"]}


@contextlib.contextmanager
def fresh_ext4(size="8G"):
    """A new ext4 (journal, nodiscard) on a loop device over a sparse file in /var/tmp (this machine's
    disk, not memory), mounted at a temporary directory: README's "stores that compare"."""
    with tempfile.TemporaryDirectory(dir="/var/tmp") as work:
        img, mnt = os.path.join(work, "ext4.img"), os.path.join(work, "mnt")
        os.mkdir(mnt)
        run(["truncate", "-s", size, img])
        dev = run(["losetup", "--find", "--show", "--direct-io=on", img]).strip()
        try:
            run(["mkfs.ext4", "-q", "-E", "nodiscard", dev])
            run(["mount", "-o", "nodiscard", dev, mnt])
            try:
                yield mnt
            finally:
                run(["umount", mnt], check=False)
        finally:
            run(["losetup", "-d", dev], check=False)


def gluster(b, a):
    """The README's GlusterFS volumes, client caching off and on: a one-brick volume of this machine's
    glusterd each, `tierbench run --engine all --rounds 2 --batch lookup=128`, io_uring ÷ sync a round."""
    run(["gluster", "--mode=script", "pool", "list"])  # glusterd is running
    host = next(x for x in run(["hostname", "-I"]).split() if ":" not in x and not x.startswith("127."))
    out = {}
    for caching in ("off", "on"):
        vol = f"aims-{caching}-{os.getpid()}"
        with tempfile.TemporaryDirectory() as brick, tempfile.TemporaryDirectory() as mnt:
            os.mkdir(f"{brick}/b")
            run(["gluster", "--mode=script", "volume", "create", vol, f"{host}:{brick}/b", "force"])
            try:
                opts = "log-level=WARNING"
                if caching == "off":
                    for o in ("stat-prefetch", "quick-read", "io-cache", "read-ahead", "open-behind", "readdir-ahead"):
                        run(["gluster", "--mode=script", "volume", "set", vol, f"performance.{o}", "off"])
                    opts += ",attribute-timeout=0,entry-timeout=0,negative-timeout=0"
                run(["gluster", "--mode=script", "volume", "start", vol])
                run(["mount", "-t", "glusterfs", "-o", opts, f"{host}:/{vol}", mnt])
                try:
                    for rows in rounds(run([f"{b.bin}/tierbench", "run", "--dir", f"{mnt}/tb", "--engine", "all",
                                            "--rounds", "2", "--batch", "lookup=128", "--json"])):
                        for w in ("lookup", "load", "store"):
                            out.setdefault(f"gluster_{caching}_{w}", []).append(
                                rows[(w, "uring")]["keys_per_sec"] / rows[(w, "sync")]["keys_per_sec"])
                finally:
                    run(["umount", "-l", mnt], check=False)
            finally:
                run(["gluster", "--mode=script", "volume", "stop", vol, "force"], check=False)
                run(["gluster", "--mode=script", "volume", "delete", vol], check=False)
    return out


def fio(builds, a):
    out = run(["bash", os.path.join(TOP, "cmd/tierbench/testdata/fio/run.sh"), str(a.rounds)]
              + [f"{b.bin}/tierbench" for b in builds])
    got = {b.name: {} for b in builds}
    for line in out.splitlines():
        m = re.match(r"(\S+) (load|store): ÷ fio per round ([\d. ]+);", line)
        if m:
            name = os.path.basename(os.path.dirname(m[1]))
            got[name][f"fio_{m[2]}"] = [float(x) for x in m[3].split()]
    return got


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--old", help="a revision to build and run beside this tree")
    p.add_argument("--fio", action="store_true", help="also the 2 MiB O_DIRECT loads and stores against fio")
    p.add_argument("--only", default=",".join(DEFAULT_PARTS),
                   help=f"the parts to run, of {','.join(PARTS)} (default: all but gluster)")
    p.add_argument("--benchtime", default="1s", help="-test.benchtime of the tier's benchmarks")
    a = p.parse_args()
    parts = a.only.split(",") if a.only else []
    if unknown := set(parts) - set(PARTS):
        p.error(f"unknown parts: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory() as work:
        builds = [Build("new", TOP, work)]
        if a.old:
            tree = os.path.join(work, "old-tree")
            run(["git", "-C", TOP, "worktree", "add", "--detach", tree, a.old])
            try:
                builds.append(Build("old", tree, work))
                measure(builds, parts, a)
            finally:
                run(["git", "-C", TOP, "worktree", "remove", "--force", tree], check=False)
        else:
            measure(builds, parts, a)


def measure(builds, parts, a):
    got = {b.name: {} for b in builds}  # build -> aim -> [value per round]
    for r in range(a.rounds):
        for k in range(len(builds)):
            b = builds[(k + r) % len(builds)]
            for part in parts:
                print(f"round {r + 1}: {b.name}: {part}", file=sys.stderr)
                try:
                    figures = globals()[part](b, a)
                except Exception as e:  # one part failing leaves the others' figures
                    print(f"round {r + 1}: {b.name}: {part} failed: {e}", file=sys.stderr)
                    continue
                for key, v in figures.items():  # a value, or a list of them (a part's own rounds)
                    got[b.name].setdefault(key, []).extend(v if isinstance(v, list) else [v])
                print("  " + json.dumps({k: [round(x, 3) for x in v] if isinstance(v, list) else round(v, 3)
                                         for k, v in figures.items()}), file=sys.stderr)
    if a.fio:
        print("fio: cmd/tierbench/testdata/fio/run.sh", file=sys.stderr)
        try:
            for name, figures in fio(builds, a).items():
                got[name].update(figures)
        except Exception as e:  # the figures above still stand
            print(f"fio failed: {e}", file=sys.stderr)
    report(builds, got)


def report(builds, got):
    head = f"{'aim':44}" + "".join(f"{b.name + ': median (range) over rounds':>40}" for b in builds)
    print(head)
    for key, what, unit, met in AIMS:
        cells = []
        for b in builds:
            ns, calls = got[b.name].get(key + "_n"), got[b.name].get(key + "_calls")
            if ns and calls:  # pooled over the rounds
                cells.append(f"{sum(ns) / sum(calls) * 1e6:.1f} ({sum(ns)} of {sum(calls):,} calls)")
                continue
            vs = got[b.name].get(key)
            if not vs:
                cells.append("-")
                continue
            m = statistics.median(vs)
            verdict = "" if met is None else "met" if met(m) else "MISSED"
            cells.append(f"{m:.2f}{unit} ({min(vs):.2f}–{max(vs):.2f}, {len(vs)}) {verdict}")
        if any(c != "-" for c in cells):
            print(f"{what:44}" + "".join(f"{c:>40}" for c in cells))


if __name__ == "__main__":
    main()
