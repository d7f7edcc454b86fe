"""A directory of vLLM's filesystem offloading tier, on both engines: found by model, named by a run
config, raw blocks at vLLM's paths, corrupt blocks left or removed as on_corrupt says."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import unittest

import uringtier
from uringtier import Status

from .support import TempDirTest, collect, key, keys, payload

BLOCK = 8192

FIELDS = {
    "model_name": "org/Model-7B",
    "hash_block_size": 16,
    "gpu_blocks_per_file": 1,
    "tp_size": 2,
    "pp_size": 1,
    "pcp_size": 1,
    "dcp_size": 1,
    "dtype": "bfloat16",
    "kv_cache_groups": [{"block_size": 16, "layer_names": ["layers.0.attn"]}],
    "inference_engine": "vllm",
}


def base_name(fields: dict) -> str:
    """vLLM's base directory name for a run config."""
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
    return f"{fields['model_name'].replace('/', '_')}_{digest}"


class Base(TempDirTest):
    engine = ""

    def block_path(self, k: bytes, rank: int = 1, group: int = 0) -> str:
        h = k.hex()
        return os.path.join(self.dir, f"{base_name(FIELDS)}_r{rank}", h[:3], f"{h[3:5]}_g{group}", f"{h}.bin")

    def write_config(self) -> str:
        path = os.path.join(self.dir, "run-config.json")
        with open(path, "w") as f:
            json.dump(FIELDS, f, indent=2, sort_keys=True)
        return path

    def open(self, **kw) -> uringtier.Tier:
        kw.setdefault("rank", 1)
        tier = uringtier.Tier(self.dir, BLOCK, engine=self.engine, cache_ttl=0, layout="vllm", **kw)
        self.addCleanup(tier.close)
        return tier


class Conformance:
    def test_store_as_vllm_does(self: Base) -> None:
        tier = self.open(vllm_config=self.write_config())
        self.assertEqual(tier.namespace, base_name(FIELDS) + "_r1")
        with open(os.path.join(self.dir, base_name(FIELDS), "config.json")) as f:
            self.assertEqual(f.read(), json.dumps(FIELDS, indent=2, sort_keys=True), "config.json as vLLM writes it")
        tier.store(1, keys(0, 4), [payload(i, BLOCK) for i in range(4)])
        self.assertEqual(collect(tier, [1])[1].statuses, [Status.STORED] * 4)
        for i in range(4):
            with open(self.block_path(key(i)), "rb") as f:
                self.assertEqual(f.read(), payload(i, BLOCK), "the payload alone, at vLLM's path")
        tier.store(2, keys(0, 4), [payload(i, BLOCK) for i in range(4)])
        self.assertEqual(collect(tier, [2])[2].statuses, [Status.PRESENT] * 4, "a block there is not written again")

    def test_group_and_parallel_agnostic(self: Base) -> None:
        # parallel_agnostic: the run config's four parallel sizes count as 1 and the rank as 0.
        agnostic = dict(FIELDS, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1)
        self.assertNotEqual(base_name(agnostic), base_name(FIELDS))
        tier = self.open(vllm_config=self.write_config(), rank=3, group=2, parallel_agnostic=True)
        self.assertEqual(tier.namespace, base_name(agnostic) + "_r0")
        with open(os.path.join(self.dir, base_name(agnostic), "config.json")) as f:
            self.assertEqual(json.loads(f.read()), agnostic)
        tier.store(1, [key(7)], [payload(7, BLOCK)])
        self.assertEqual(collect(tier, [1])[1].statuses, [Status.STORED])
        h = key(7).hex()
        path = os.path.join(self.dir, base_name(agnostic) + "_r0", h[:3], f"{h[3:5]}_g2", f"{h}.bin")
        with open(path, "rb") as f:
            self.assertEqual(f.read(), payload(7, BLOCK), "group 2's directory of rank 0")
        tier.close()
        # The same directory named by its base, as when dir holds several for the model; another
        # group of it does not see group 2's block.
        for group, want in ((2, Status.LOADED), (0, Status.MISSING)):
            tier = self.open(vllm_base=base_name(agnostic), rank=0, group=group)
            self.assertEqual(tier.namespace, base_name(agnostic) + "_r0")
            buf = bytearray(BLOCK)
            tier.load(2, [key(7)], [buf])
            self.assertEqual(collect(tier, [2])[2].statuses, [want], f"group {group}")
            if want == Status.LOADED:
                self.assertEqual(bytes(buf), payload(7, BLOCK))
            tier.close()

    def test_read_vllm_blocks(self: Base) -> None:
        # Blocks as vLLM writes them: the raw payload in a temporary file renamed into place.
        for i in range(6):
            path = self.block_path(key(i))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + f"_{i + 1000}.tmp", "wb") as f:
                f.write(payload(i, BLOCK))
            os.replace(path + f"_{i + 1000}.tmp", path)
        os.makedirs(os.path.join(self.dir, base_name(FIELDS)))
        tier = self.open(model=FIELDS["model_name"])
        bufs = [mmap.mmap(-1, BLOCK) for _ in range(8)]
        tier.load(1, keys(0, 8), bufs)
        r = collect(tier, [1])[1]
        self.assertEqual(r.statuses, [Status.LOADED] * 6 + [Status.MISSING] * 2)
        for i in range(6):
            self.assertEqual(bytes(bufs[i]), payload(i, BLOCK))

    def test_corrupt_left_or_removed(self: Base) -> None:
        cfg = self.write_config()
        for on_corrupt, stays in (("default", True), ("remove", False)):
            with self.subTest(on_corrupt):
                path = self.block_path(key(50))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(payload(50, BLOCK)[:100])  # truncated
                tier = self.open(vllm_config=cfg, on_corrupt=on_corrupt)
                tier.load(1, [key(50)], [bytearray(BLOCK)])
                self.assertEqual(collect(tier, [1])[1].statuses, [Status.CORRUPT])
                self.assertEqual(os.path.exists(path), stays)
                self.assertEqual(tier.stats()["removed"], 0 if stays else 1)
                tier.close()
        self.assertFalse(os.path.exists(os.path.join(self.dir, "~quarantine")))

    def test_bad_vllm_options(self: Base) -> None:
        for kw, message in [
            ({}, "needs a model"),
            ({"model": "org/absent"}, "org_absent_<12 hex>"),
            ({"model": "org/m", "namespace": "x"}, "namespace with layout=vllm"),
            ({"model": "org/m", "format": "framed"}, "vLLM's blocks are raw"),
            ({"model": "org/m", "rank": -1}, "rank -1"),
        ]:
            with self.subTest(kw):
                with self.assertRaises((ValueError, OSError)) as cm:
                    self.open(**kw)
                self.assertIn(message, str(cm.exception))
        with self.assertRaisesRegex(ValueError, "model is for layout=vllm"):
            uringtier.Tier(self.dir, BLOCK, engine=self.engine, model="org/m")


class SyncEngine(Conformance, Base):
    engine = "sync"


class URingEngine(Conformance, Base):
    engine = "uring"


if __name__ == "__main__":
    unittest.main()
