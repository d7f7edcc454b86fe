"""The Tier: submit lookups, loads, stores and deletes, poll their results; no call waits for the
filesystem."""

from __future__ import annotations

import ctypes
import enum
import json
import mmap
import operator
import os
import threading
from array import array
from collections.abc import Sequence
from ctypes import c_uint8, c_uint64, c_void_p
from dataclasses import dataclass, fields
from typing import Any

from . import _lib
from ._buffers import Pinned, pin
from .errors import InvalidOptionsError, InvalidRequestError, UringTierError

__all__ = ["Tier", "Result", "Status", "Op", "EngineInfo"]


class Op(enum.IntEnum):
    """What a request did (enum ut_op)."""

    LOOKUP = 1
    LOAD = 2
    STORE = 3
    RELEASE = 4  #: the kernel let go of buffers a Result reported held
    DELETE = 5  #: remove blocks


class Status(enum.IntEnum):
    """The outcome of one key (enum ut_status)."""

    PENDING = 0
    FOUND = 1  #: lookup: the block exists
    LOADED = 2  #: load: the payload is in the buffer, verified (checksums; raw blocks: their size)
    STORED = 3  #: store: the block was published
    PRESENT = 4  #: store: the block was already there; nothing written
    MISSING = 5  #: no such block (lookup, load, delete)
    CORRUPT = 6  #: load: the file failed verification (quarantined, removed or left: on_corrupt)
    TIMED_OUT = 7  #: the deadline passed, or the circuit breaker is open
    FAILED = 8  #: an IO error
    CANCELED = 9  #: cancel() or close() ended it first
    SKIPPED = 10  #: lookup_prefix: after a miss, not looked up
    DELETED = 11  #: delete: the block was removed
    #: store: refused before writing, for want of room (the tier's capacity reached, its blocks
    #: younger than evict_min_age, or the filesystem full); nothing of the block is left behind
    FULL = 12

    @property
    def ok(self) -> bool:
        """Whether this is a success (found, loaded, stored, present, deleted)."""
        return _ok(self)


def _ok(s: int) -> bool:
    """UT_OK_STATUS of uringtier.h."""
    return Status.FOUND <= s <= Status.PRESENT or s == Status.DELETED


class Result:
    """A finished request, as poll() returns it.

    ``status`` holds one Status value per key, in the order submitted, as bytes (cheap to make and
    to scan: ``result.status.count(Status.FOUND)``, ``Status(result.status[i])``).
    """

    __slots__ = ("req", "op", "status", "prefix", "held")

    def __init__(self, req: int, op: Op, status: bytes, prefix: int, held: int) -> None:
        self.req = req  #: the request ID given at submit
        self.op = op  #: what the request did; Op.RELEASE for a release of held buffers
        self.status = status  #: one Status value per key
        self.prefix = prefix  #: how many leading keys succeeded: the prefix hit
        #: buffers the kernel still holds (a hung filesystem); an Op.RELEASE Result follows
        self.held = held

    @property
    def statuses(self) -> list[Status]:
        """The keys' outcomes as Status values."""
        return [Status(s) for s in self.status]

    @property
    def ok(self) -> list[bool]:
        """Per key: did it succeed (found, loaded, stored, present, deleted)?"""
        return [_ok(s) for s in self.status]

    def __len__(self) -> int:
        return len(self.status)

    def __repr__(self) -> str:
        counts = {Status(s).name.lower(): self.status.count(s) for s in set(self.status)}
        return f"Result(req={self.req}, op={self.op.name}, prefix={self.prefix}, held={self.held}, {counts})"


@dataclass(frozen=True)
class EngineInfo:
    """Which engine a tier runs, and why."""

    kind: str  #: "uring" or "sync"
    fallback: str  #: why engine="auto" chose sync; "" otherwise
    rings: int  #: io_uring instances
    flags: str  #: io_uring setup flags in force
    direct: bool  #: loads into page-aligned buffers use O_DIRECT
    no_direct: str  #: why not, when direct is False
    fs: str  #: the filesystem under the namespace directory
    inline: bool  #: reads and writes may complete in the owner thread
    stores_sync: bool  #: stores run as plain syscalls on a pool of goroutines (a local filesystem), their O_DIRECT writes on the rings when many are in flight
    loads_sync: bool  #: loads run on that pool too (tmpfs)
    last_page_apart: bool  #: O_DIRECT loads read each block's last page apart first (a FUSE server that miscounts reads at a file's end)


@dataclass(frozen=True)
class Gauges:
    """A tier's levels of the moment (see ut_read_gauges)."""

    in_flight: int  #: key operations in the kernel or the library's workers
    queued: int  #: requests waiting for free operation slots
    stuck: int  #: operations past their deadline, not yet answered
    held: int  #: caller buffers the kernel still holds
    breaker_open: bool  #: new keys fail fast but for one probe


def _seconds(name: str, value: float) -> str:
    if value < 0:
        raise InvalidOptionsError(f"{name} is negative: {value}")
    return f"{round(value * 1e6)}us"


def _byte_count(name: str, value: int) -> str:
    if isinstance(value, bool):
        raise InvalidOptionsError(f"{name} is a bool: want a number of bytes")
    try:
        return str(operator.index(value))
    except TypeError:
        raise InvalidOptionsError(f"{name} is {value!r}: want an int (bytes)") from None


def _number(name: str, value: float) -> str:
    if isinstance(value, bool):
        raise InvalidOptionsError(f"{name} is a bool: want a number")
    try:
        return repr(float(value))  # the library refuses nan and inf, and values out of range
    except (TypeError, ValueError):
        raise InvalidOptionsError(f"{name} is {value!r}: want a number") from None


def _encode_keys(keys: Sequence[bytes] | bytes, key_size: int | None) -> tuple[bytes, int, int, object]:
    """The keys as ut_lookup takes them: (concatenated keys, their count, the address of their
    sizes or 0 when all have key_size bytes, the sizes' owner to keep alive during the call)."""
    if key_size is not None:
        data = keys if isinstance(keys, bytes) else bytes(memoryview(keys).cast("B"))  # type: ignore[arg-type]
        if key_size <= 0 or len(data) % key_size:
            raise InvalidRequestError(f"{len(data)} bytes of keys do not split into keys of {key_size} bytes")
        return data, len(data) // key_size, 0, None
    if isinstance(keys, (bytes, bytearray, memoryview, str)):
        raise TypeError(
            f"keys must be a sequence of byte strings, not one {type(keys).__name__} (packed keys need key_size=)")
    try:
        data = b"".join(keys)
    except TypeError as e:
        raise TypeError(f"keys must be byte strings: {e}") from None
    sizes = array("I", map(len, keys))
    return data, len(sizes), sizes.buffer_info()[0], sizes


class Tier:
    """An asynchronous store of fixed-size blocks under ``path/namespace``.

    Submit with lookup, lookup_prefix, load, store and delete: each returns at once, having queued the
    request or raised (BusyError when ``depth`` requests are unpolled; ClosedError;
    InvalidRequestError). Every queued request produces exactly one Result, which poll() returns;
    fileno() becomes readable when results are waiting. The IO runs on the library's threads,
    which never take the GIL, and the submit and poll calls keep the GIL (they take microseconds),
    so a scheduler thread calling them is never made to wait for it.

    Buffers given to load and store stay pinned (and must not be touched, for a load) until the
    request's Result has been polled; if that Result has ``held`` > 0, until an Op.RELEASE Result
    with the same ``req``. The Tier keeps the exports and references meanwhile.

    With ``buffers=N`` the Tier allocates N buffers of block_size bytes (``Tier.buffers``, writable
    memoryviews): the fastest memory to load into and store from. They are page-aligned and
    registered with the io_uring engine, which reads a block into one with one O_DIRECT read whose
    pages the kernel need not pin, where a load into other memory takes a vectored read with every
    page pinned and unpinned. They stay valid Python memory after close.

    Methods are safe to call from several threads; results go to whichever thread polls.

    Args:
        path: the tier's root directory (created if needed).
        block_size: every block's payload size in bytes.
        namespace: the directory under path holding the blocks ("default"; with layout="vllm",
            the rank directory, found by the library: leave it None).
        engine: "auto" (io_uring where usable, else plain syscalls), "uring" or "sync".
        depth: requests submitted and not yet polled; beyond it, submits raise BusyError.
        batch_max: most keys in one request.
        lookup_timeout: a lookup key's deadline in seconds from submit (then Status.TIMED_OUT).
        io_timeout: a load or store key's deadline in seconds.
        cache_ttl: answer lookups this recent (seconds) from memory; 0 turns the cache off.
            Loads always go to the filesystem, so a stale hit is safe: its load reports the
            block missing.
        durability: "none", "data" or "full" (fsync of stores).
        capacity: bound, in bytes, on the block files in the namespace directory, whoever wrote
            them (None or 0: no bound). With a bound, the tiers sharing the directory (in any
            process or host) elect one evictor, which removes the least recently used blocks
            once usage passes high_watermark of the bound, down to low_watermark; while usage is
            at the bound (every block younger than evict_min_age) or the filesystem is full,
            stores are refused before writing: Status.FULL. Give every tier sharing the directory
            the same bound: any may become the evictor. ``stats()`` has the usage and the
            evictor's counters.
        capacity_share: the bound as a share (0 to 1) of the filesystem's size instead of
            capacity (at most one of the two).
        high_watermark: eviction starts above this share of the bound (library default 0.9).
        low_watermark: and stops at this share (0 < low <= high <= 1; default 0.8, at most high).
        evict_min_age: blocks used (stored, found, loaded) this recently, in seconds, are never
            evicted; 0: no minimum (default 10).
        evict_interval: how often, in seconds, the evictor (or a tier waiting to become it) looks:
            the takeover time when the evictor dies (default 1).
        touch_interval: a hit sets the block file's access time at most this often per block, in
            seconds, so that the evictor in any process sees the use; 0: off (default 60 with a
            bound, else off).
        close_timeout: how long ``with`` waits for the filesystem when closing, in seconds.
        buffers: how many buffers of block_size the Tier allocates for loads and stores
            (``Tier.buffers``; default 0).
        **options: further options of ut_open by name (cache_size, rings, ops_max, workers_max,
            sync_workers, breaker_threshold, lookup_op, direct, format, on_corrupt, layout, and
            layout="vllm"'s model, rank, group, vllm_base, vllm_config, parallel_agnostic); see
            uringtier.h. rings defaults to one fewer than the CPUs (at least 1, at most 8): the
            interpreter's thread keeps a CPU of its own.

    A directory of vLLM's filesystem offloading tier (raw blocks at
    ``<path>/<model>_<12 hex>_r<rank>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin``, keys being vLLM's
    block hashes)::

        Tier("/mnt/kv", block_size, layout="vllm", model="meta-llama/Llama-3.1-8B", rank=0, group=0)

    Reading it changes nothing (``on_corrupt="remove"`` deletes corrupt blocks, as vLLM does), and
    stores publish as vLLM's do, so both can write it at once.
    """

    _RESULTS_MAX = 64

    def __init__(
        self,
        path: str | os.PathLike,
        block_size: int,
        *,
        namespace: str | None = None,
        engine: str = "auto",
        depth: int = 256,
        batch_max: int = 4096,
        lookup_timeout: float = 5.0,
        io_timeout: float = 30.0,
        cache_ttl: float = 1.0,
        durability: str = "none",
        capacity: int | None = None,
        capacity_share: float | None = None,
        high_watermark: float | None = None,
        low_watermark: float | None = None,
        evict_min_age: float | None = None,
        evict_interval: float | None = None,
        touch_interval: float | None = None,
        close_timeout: float = 5.0,
        buffers: int = 0,
        **options: Any,
    ) -> None:
        self._handle = 0
        self._lib = _lib.load()
        if batch_max < 1:
            raise InvalidOptionsError(f"batch_max is {batch_max}: want at least 1")
        opts: dict[str, Any] = {"block_size": block_size}
        if namespace is not None:
            opts["namespace"] = namespace
        opts |= {
            "engine": engine,
            "depth": depth,
            "batch_max": batch_max,
            "lookup_timeout": _seconds("lookup_timeout", lookup_timeout),
            "io_timeout": _seconds("io_timeout", io_timeout),
            "cache_ttl": _seconds("cache_ttl", cache_ttl),
            "durability": durability,
        }
        # The capacity options, where given; the library's defaults otherwise (some depend on
        # others: low_watermark on high_watermark, touch_interval on the bound).
        for name, value, encode in [
            ("capacity", capacity, _byte_count),
            ("capacity_share", capacity_share, _number),
            ("high_watermark", high_watermark, _number),
            ("low_watermark", low_watermark, _number),
            ("evict_min_age", evict_min_age, _seconds),
            ("evict_interval", evict_interval, _seconds),
            ("touch_interval", touch_interval, _seconds),
        ]:
            if value is not None:
                opts[name] = encode(name, value)
        for k, v in options.items():
            opts[k] = str(v).lower() if isinstance(v, bool) else v
        text = " ".join(f"{k}={v}" for k, v in opts.items())
        if any(c.isspace() or c == "," for v in opts.values() for c in str(v)):
            raise InvalidOptionsError(f"option values must not contain spaces or commas: {text}")
        try:
            if isinstance(buffers, bool):
                raise TypeError
            buffers = operator.index(buffers)  # a NumPy integer too
        except TypeError:
            raise InvalidOptionsError(f"buffers={buffers!r}: want a count of buffers") from None
        handle = c_uint64()
        arena = None
        if buffers == 0:
            rc = self._lib.ut_open(os.fsencode(path), text.encode(), ctypes.byref(handle))
        else:
            size = self._lib.ut_buffers_size(block_size, buffers) if block_size > 0 and buffers > 0 else 0
            if size == 0:
                raise InvalidOptionsError(f"buffers={buffers} of block_size={block_size}: want 1 or more of 1 or more bytes")
            # The tier's buffers and the memory around them, in an anonymous mapping that Python
            # owns: views of the buffers keep it alive after close, and loads and stores the kernel
            # still holds keep it through their pins. From 2 MiB on they start on a 2 MiB boundary
            # in transparent huge pages, where the kernel has them, as the Go tier's own do.
            slack = _HUGE_PAGE if size >= _HUGE_PAGE else 0
            arena = mmap.mmap(-1, size + slack)
            start = ctypes.addressof(ctypes.c_char.from_buffer(arena))
            base = start + (-start % _HUGE_PAGE if slack else 0)
            if slack and hasattr(mmap, "MADV_HUGEPAGE"):
                try:
                    arena.madvise(mmap.MADV_HUGEPAGE)
                except OSError:
                    pass  # no transparent huge pages here: small pages
            rc = self._lib.ut_open_buffers(os.fsencode(path), text.encode(), base, size, buffers, ctypes.byref(handle))
        if rc < 0:
            raise self._lib.error(rc, f"open {path}")
        self._handle = handle.value
        #: the Tier's buffers (``buffers=N``): N writable memoryviews of block_size bytes
        self.buffers: list[memoryview] = []
        if arena is not None:
            addrs = (c_void_p * buffers)()
            rc = self._lib.ut_buffers(self._handle, addrs, buffers)
            if rc != buffers:
                err = self._lib.error(rc, "buffers") if rc < 0 else UringTierError(f"buffers: {rc} of {buffers}")
                self._handle = 0  # nothing submitted yet: close and free it here, not in __del__
                self._lib.ut_close(handle.value, 0)
                self._lib.ut_free(handle.value)
                raise err
            whole = memoryview(arena)
            self.buffers = [whole[a - start:a - start + block_size] for a in addrs]
        self.path = os.fsdecode(path)
        self.block_size = block_size  #: every block's payload size
        #: the directory under path holding the blocks (with layout="vllm", the rank directory)
        self.namespace = namespace if namespace is not None else self.stats()["namespace"]
        self.batch_max = batch_max
        self.close_timeout = close_timeout
        self._results = (_lib.ut_result * self._RESULTS_MAX)()
        self._status_mem = bytearray(batch_max)
        self._status = (c_uint8 * batch_max).from_buffer(self._status_mem)
        self._status_view = memoryview(self._status_mem)
        self._pins: dict[int, list[Pinned]] = {}  # request ID -> its pinned buffers
        self._pins_lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._engine: EngineInfo | None = None
        self._closed = False

    # Submits.

    def lookup(self, req: int, keys: Sequence[bytes] | bytes, key_size: int | None = None) -> None:
        """Asks which of keys (byte strings of 8 to 64 bytes) exist; returns at once.

        req is any integer ID (0 to 2**64-1) not in flight on this tier. With key_size, keys is
        one bytes-like object holding keys of key_size bytes back to back (a NumPy array of
        digests, say): the cheapest form, with no per-key work in Python.
        """
        req = _request_id(req, "lookup")
        data, n, sizes, _keep = _encode_keys(keys, key_size)
        rc = self._lib.ut_lookup(self._handle, req, data, len(data), sizes, n)
        if rc < 0:
            raise self._lib.error(rc, "lookup")

    def lookup_prefix(self, req: int, keys: Sequence[bytes] | bytes, key_size: int | None = None) -> None:
        """lookup() for a caller that wants only the prefix: keys after a miss may be skipped."""
        req = _request_id(req, "lookup_prefix")
        data, n, sizes, _keep = _encode_keys(keys, key_size)
        rc = self._lib.ut_lookup_prefix(self._handle, req, data, len(data), sizes, n)
        if rc < 0:
            raise self._lib.error(rc, "lookup_prefix")

    def delete(self, req: int, keys: Sequence[bytes] | bytes, key_size: int | None = None) -> None:
        """Removes the keys' blocks; returns at once. keys and key_size are as for lookup().

        Each key ends Status.DELETED, or Status.MISSING if there was no block. Deletes reach the
        filesystem after the lookups, loads and stores submitted before them: a load that opened
        a block first reads it whole, one after reports it missing.
        """
        req = _request_id(req, "delete")
        data, n, sizes, _keep = _encode_keys(keys, key_size)
        rc = self._lib.ut_delete(self._handle, req, data, len(data), sizes, n)
        if rc < 0:
            raise self._lib.error(rc, "delete")

    def load(self, req: int, keys: Sequence[bytes] | bytes, buffers: Sequence[Any], key_size: int | None = None) -> None:
        """Reads key i's block into buffers[i] (writable, block_size bytes each); returns at once.

        The buffers are the tier's until this request's Result is polled (see the class doc).
        keys and key_size are as for lookup().
        """
        self._submit_io(self._lib.ut_load, "load", req, keys, key_size, buffers, writable=True)

    def store(self, req: int, keys: Sequence[bytes] | bytes, buffers: Sequence[Any], key_size: int | None = None) -> None:
        """Writes key i's block from buffers[i] (block_size bytes each); returns at once.

        The buffers are the tier's until this request's Result is polled (see the class doc).
        keys and key_size are as for lookup().
        """
        self._submit_io(self._lib.ut_store, "store", req, keys, key_size, buffers, writable=False)

    def _submit_io(self, fn: Any, what: str, req: int, keys: Sequence[bytes] | bytes, key_size: int | None,
                   buffers: Sequence[Any], writable: bool) -> None:
        req = _request_id(req, what)
        data, n, sizes, _keep = _encode_keys(keys, key_size)
        if len(buffers) != n:
            raise InvalidRequestError(f"{what}: {n} keys but {len(buffers)} buffers")
        pins: list[Pinned] = []
        registered = False
        try:
            for i, b in enumerate(buffers):
                pins.append(pin(b, writable, i))
                if pins[-1].size != self.block_size:
                    raise InvalidRequestError(
                        f"{what}: buffer {i} is {pins[-1].size} bytes, the block size is {self.block_size}")
            addrs = (c_void_p * len(pins))(*(p.address for p in pins))
            with self._pins_lock:
                if req in self._pins:
                    raise InvalidRequestError(f"{what}: request {req} is already in flight")
                self._pins[req] = pins
                registered = True
            rc = fn(self._handle, req, data, len(data), sizes, n, addrs, self.block_size)
            if rc < 0:
                raise self._lib.error(rc, what)
        except BaseException:
            # Refused (or interrupted before the library took the request):
            # the buffers are the caller's again, and the ID is free.
            if registered:
                with self._pins_lock:
                    del self._pins[req]
            for p in pins:
                p.release()
            raise

    # Results.

    def poll(self, max_results: int = _RESULTS_MAX) -> list[Result]:
        """Returns finished requests (at most max_results), or [] if none is waiting. Never waits.

        Polling also unpins the buffers of the loads and stores it returns (unless held).
        """
        out: list[Result] = []
        with self._poll_lock:
            while len(out) < max_results:
                cap = min(max_results - len(out), self._RESULTS_MAX)
                n = self._lib.ut_poll(self._handle, self._results, cap, self._status, len(self._status_mem))
                if n < 0:
                    raise self._lib.error(n, "poll")
                for r in self._results[:n]:
                    op = Op(r.op)
                    res = Result(r.req, op, self._status_view[r.first:r.first + r.keys].tobytes(), r.prefix, r.held)
                    if op not in (Op.LOOKUP, Op.DELETE) and r.held == 0:
                        self._unpin(r.req)
                    out.append(res)
                if n < cap:
                    break
        return out

    def _unpin(self, req: int) -> None:
        with self._pins_lock:
            pins = self._pins.pop(req, ())
        for p in pins:
            p.release()

    def fileno(self) -> int:
        """An eventfd that becomes readable when results are waiting (for selectors, asyncio,
        epoll). Readiness is a hint; poll() clears it. Do not read or close it."""
        fd = self._lib.ut_fd(self._handle)
        if fd < 0:
            raise self._lib.error(fd, "fileno")
        return fd

    def cancel(self, req: int) -> bool:
        """Cancels request req; its Result still arrives. Returns whether it was in flight."""
        rc = self._lib.ut_cancel(self._handle, _request_id(req, "cancel"))
        if rc < 0:
            raise self._lib.error(rc, "cancel")
        return rc == 1

    # Information.

    def gauges(self) -> Gauges:
        """The tier's levels of the moment: what stats() has of them, read without its counters and
        JSON, cheap enough for every scheduler step."""
        g = _lib.ut_gauges()
        rc = self._lib.ut_read_gauges(self._handle, ctypes.byref(g))
        if rc < 0:
            raise self._lib.error(rc, "gauges")
        return Gauges(g.in_flight, g.queued, g.stuck, g.held, bool(g.breaker_open))

    def stats(self) -> dict[str, Any]:
        """The tier's counters (see ut_stats): per op ("lookup", "load", "store", "delete")
        requests, keys, outcomes and latency; the capacity's "capacity_limit", "usage",
        "evictor", "evictor_holder", "evicted", "evicted_bytes", "scans", "touches"; etc."""
        return json.loads(self._json(self._lib.ut_stats, "stats"))

    @property
    def engine(self) -> EngineInfo:
        """Which engine the tier runs (io_uring or sync) and, for a fallback, why."""
        if self._engine is None:
            info = json.loads(self._json(self._lib.ut_engine, "engine"))
            self._engine = EngineInfo(**{f.name: info[f.name] for f in fields(EngineInfo)})
        return self._engine

    def _json(self, fn: Any, what: str) -> bytes:
        size = 4096
        while True:
            buf = ctypes.create_string_buffer(size)
            n = fn(self._handle, buf, size)
            if n < 0:
                raise self._lib.error(n, what)
            if n < size:
                return buf.value
            size = n + 1

    # Closing.

    def close(self, timeout: float | None = None) -> None:
        """Stops the tier, waiting at most timeout seconds (default: close_timeout) for the
        filesystem; the GIL is released meanwhile. Requests submitted before still each get their
        Result, which poll() returns after close; later submits raise ClosedError.

        Raises StuckError if a hung filesystem still holds operations at the timeout; the tier is
        closed all the same, and their buffers stay pinned until their Op.RELEASE Results.
        A second close does nothing.
        """
        if self._closed:
            return
        if timeout is None:
            timeout = self.close_timeout
        rc = self._lib.ut_close(self._handle, _lib.millis(timeout))
        self._closed = rc in (0, _lib.ESTUCK)
        if rc < 0:
            raise self._lib.error(rc, "close")

    def __enter__(self) -> Tier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Frees the handle and the eventfd. Buffers the kernel may still write stay pinned for the
        # life of the process: nothing will poll their release any more.
        handle = getattr(self, "_handle", 0)
        if not handle:
            return
        try:
            self._lib.ut_close(handle, 0)  # returns at once; the first close's code if closed already
            while self.poll():  # results not yet polled: unpins what the kernel no longer holds
                pass
            self._handle = 0
            self._lib.ut_free(handle)
        except UringTierError:
            return  # a forked child: the parent's tier is not this process's to free
        with self._pins_lock:
            if self._pins:
                _held_forever.append(self._pins)
                self._pins = {}


_HUGE_PAGE = 2 << 20  # a transparent huge page on x86-64 and arm64

_held_forever: list[dict[int, list[Pinned]]] = []
"""Pins of tiers freed while the kernel still held their buffers: never released."""


def _request_id(req: Any, what: str) -> int:
    """req as a request ID: an integer (a NumPy one too) from 0 to 2**64-1, which ctypes would
    otherwise reduce modulo 2**64, so that its Result came back under another ID."""
    try:
        if isinstance(req, bool):
            raise TypeError
        r = operator.index(req)
    except TypeError:
        raise InvalidRequestError(f"{what}: request ID {req!r} is not an integer") from None
    if not 0 <= r < 1 << 64:
        raise InvalidRequestError(f"{what}: request ID {r} is outside 0 to 2**64-1")
    return r
