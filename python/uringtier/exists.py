"""batch_exists: the drop-in for a C loop of access() calls made with the GIL released."""

from __future__ import annotations

import os
from collections.abc import Iterable
from ctypes import c_uint8

from . import _lib
from .errors import InvalidRequestError
from .tier import Status

__all__ = ["batch_exists", "batch_status"]

StrPath = str | bytes | os.PathLike


def batch_status(paths: Iterable[StrPath], timeout: float = 5.0) -> list[Status]:
    """Looks up every path as access(path, F_OK) would, in parallel on the library's threads, with
    the GIL released, and returns each one's Status: FOUND, MISSING, TIMED_OUT (not answered within
    timeout seconds: a hung filesystem) or FAILED (another error, such as EACCES).

    It waits at most timeout seconds, however many paths a hung filesystem holds; threads stuck in
    it never touch this call's memory afterwards. At most 64 paths are looked up at once, process
    wide, so a hung filesystem holds at most 64 threads.
    """
    encoded = [os.fsencode(p) for p in paths]
    n = len(encoded)
    if n == 0:
        return []
    blob = b"\0".join(encoded) + b"\0"
    if blob.count(0) != n:
        raise InvalidRequestError("batch_exists: a path contains a NUL byte")
    lib = _lib.load()
    status = (c_uint8 * n)()
    rc = lib.ut_exists(blob, len(blob), n, _lib.millis(timeout), status)
    if rc < 0:
        raise lib.error(rc, "batch_exists")
    return [Status(s) for s in bytes(status)]


def batch_exists(paths: Iterable[StrPath], timeout: float = 5.0) -> list[bool]:
    """Which paths exist: ``[os.path.exists(p) for p in paths]``, or a C loop of access() calls,
    without holding the GIL and in parallel, waiting at most timeout seconds (a path not answered
    by then counts as absent: a cache miss). See batch_status for the details.
    """
    found = Status.FOUND
    return [s == found for s in batch_status(paths, timeout)]
