#!/usr/bin/env python3
"""A stand-alone stand-in for vLLM's filesystem offloading tier, for the tier's tests.

It follows the protocol of vLLM's vllm/v1/kv_offload/tiering/fs (file_mapper.py names the files,
io.py reads and writes them), written out here from that protocol with the standard library only:

- base directory: <root>/<model, '/' -> '_'>_<first 12 hex of sha256 of the run config as JSON with
  sorted keys and separators "," and ":">; config.json there, json.dump(indent=2, sort_keys=True),
  written once;
- a block: <base>_r<rank>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin, the raw payload;
- store: skip when the file exists; make the parent directories; write <path>_<random>.tmp opened
  O_CREAT|O_EXCL|O_WRONLY|O_TRUNC (and O_DIRECT where a one-page probe write worked), a short write is
  an error; rename it over <path>; on error remove the temporary file;
- load: open (O_DIRECT where probed), read the block size; a short read is an error, and vLLM removes
  the file after any failed load.

Usage: vllm_fs.py COMMAND JSON, where JSON holds root, fields (the run config), rank, group,
block_size, first and count (the blocks), and for race, seconds. Commands:

  base   print {"base": name}
  write  write config.json and blocks first..first+count-1
  read   load those blocks and check every byte: {"ok": n, "bad": [...]}
  race   for `seconds`, over and over: remove each block, store it, load it and check it; prints
         counts: stores, loads (whole and right), missing (removed by the other side meanwhile),
         short (a torn file: fewer bytes than a block), wrong (a block of the right size with other
         bytes) and errors

Block i's key is sha256(b"vllm-key-%d" % i); its payload, 32 bytes at a time, sha256(b"%d/%d" % (i, j))
for j = 0, 1, ...: the Go test computes the same.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import random
import sys
import time

O_DIRECT = getattr(os, "O_DIRECT", 0)


def block_key(i: int) -> bytes:
    return hashlib.sha256(b"vllm-key-%d" % i).digest()


def block_payload(i: int, size: int) -> bytes:
    return b"".join(hashlib.sha256(b"%d/%d" % (i, j)).digest() for j in range(size // 32))


class Mapper:
    """vLLM's file names for one rank and group."""

    def __init__(self, root: str, fields: dict, rank: int, group: int) -> None:
        self.fields = fields
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]
        self.base_name = f"{fields['model_name'].replace('/', '_')}_{digest}"
        self.base = os.path.join(root, self.base_name)
        self.rank, self.group = rank, group

    def path(self, key: bytes) -> str:
        h = key.hex()
        return f"{self.base}_r{self.rank}/{h[:3]}/{h[3:5]}_g{self.group}/{h}.bin"

    def write_config(self) -> None:
        os.makedirs(self.base, exist_ok=True)
        target = os.path.join(self.base, "config.json")
        if os.path.exists(target):
            return
        with open(target, "w") as f:
            json.dump(self.fields, f, indent=2, sort_keys=True)


class IO:
    """vLLM's store and load of one block, with its O_DIRECT probe."""

    def __init__(self, directory: str, size: int) -> None:
        self.size = size
        self.suffix = f"_{random.randint(0, 2**63 - 1)}.tmp"  # one per thread in vLLM; this is one thread
        self.buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
        self.direct = self._probe(directory)

    def _probe(self, directory: str) -> bool:
        if not O_DIRECT:
            return False
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, ".o_direct_probe" + self.suffix)
        page = mmap.mmap(-1, mmap.PAGESIZE)
        try:
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | O_DIRECT, 0o644)
            try:
                os.write(fd, page)
            finally:
                os.close(fd)
            return True
        except OSError:
            return False
        finally:
            page.close()
            try:
                os.remove(path)
            except OSError:
                pass

    def store(self, path: str, payload: bytes) -> bool:
        """Returns False when the block was there already."""
        if os.path.exists(path):
            return False
        tmp = path + self.suffix
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.buf[:] = payload
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_TRUNC | (O_DIRECT if self.direct else 0)
        try:
            fd = os.open(tmp, flags, 0o644)
            try:
                n = os.write(fd, memoryview(self.buf))
                if n < self.size:
                    raise OSError(f"short write: {n} of {self.size} bytes")
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise
        return True

    def load(self, path: str) -> bytes:
        """The block's bytes; raises FileNotFoundError, or OSError for a short read (after
        removing the file, as vLLM does)."""
        fd = None
        try:
            fd = os.open(path, os.O_RDONLY | (O_DIRECT if self.direct else 0))
            n = os.readv(fd, [self.buf])
            if n < self.size:
                raise OSError(f"short read: {n} of {self.size} bytes")
        except FileNotFoundError:
            raise
        except BaseException:
            try:
                os.remove(path)
            except OSError:
                pass
            raise
        finally:
            if fd is not None:
                os.close(fd)
        return bytes(self.buf)


def main() -> int:
    cmd, args = sys.argv[1], json.loads(sys.argv[2])
    m = Mapper(args["root"], args["fields"], args.get("rank", 0), args.get("group", 0))
    if cmd == "base":
        print(json.dumps({"base": m.base_name}))
        return 0
    size = args["block_size"]
    blocks = range(args["first"], args["first"] + args["count"])
    payloads = {i: block_payload(i, size) for i in blocks}
    io = IO(os.path.dirname(m.path(block_key(0))), size)
    out: dict = {"direct": io.direct}
    if cmd == "write":
        m.write_config()
        out["stored"] = sum(io.store(m.path(block_key(i)), payloads[i]) for i in blocks)
    elif cmd == "read":
        out["ok"], out["bad"] = 0, []
        for i in blocks:
            try:
                if io.load(m.path(block_key(i))) == payloads[i]:
                    out["ok"] += 1
                    continue
                out["bad"].append(f"block {i}: other bytes")
            except OSError as e:
                out["bad"].append(f"block {i}: {e}")
    elif cmd == "race":
        counts = dict(stores=0, loads=0, missing=0, short=0, wrong=0, errors=0)
        samples: list[str] = []
        deadline = time.monotonic() + args["seconds"]
        while time.monotonic() < deadline:
            for i in blocks:
                path = m.path(block_key(i))
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
                try:
                    counts["stores"] += io.store(path, payloads[i])
                    got = io.load(path)
                except FileNotFoundError:
                    counts["missing"] += 1  # the other side removed it meanwhile: a miss, not a torn block
                    continue
                except OSError as e:
                    counts["short" if "short read" in str(e) else "errors"] += 1
                    samples.append(f"block {i}: {e}")
                    continue
                if got == payloads[i]:
                    counts["loads"] += 1
                else:
                    counts["wrong"] += 1
                    samples.append(f"block {i}: other bytes")
        out.update(counts, samples=samples[:10])
    else:
        print(f"unknown command {cmd!r}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
