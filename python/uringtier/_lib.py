"""Loading liburingtier.so: lazily, once per process, and never in a child forked after loading.

The library carries a Go runtime, which starts threads when the library is loaded and does not
survive fork(2): a child has one thread and a runtime that believes it has many, and a call into it
can hang. So nothing here runs at import time; the library is loaded by the first call that needs
it, and a fork after that replaces every function in the child with one that raises ForkedError at
once (the C library refuses such calls too, with UT_EFORK, before entering the runtime).

Non-blocking calls go through ctypes.PyDLL, which keeps the GIL: they take microseconds, and
releasing the GIL around them would let another Python thread take it, after which the scheduler
thread waits up to the interpreter's switch interval (5 ms) to get it back. The calls that may
wait, ut_open (it creates directories and probes the filesystem), ut_close, ut_free and ut_exists,
go through ctypes.CDLL, which releases the GIL for their duration.
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import POINTER, c_char_p, c_int, c_int64, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p

from .errors import (
    BrokenError,
    BusyError,
    ClosedError,
    ForkedError,
    InvalidOptionsError,
    InvalidRequestError,
    LibraryNotFoundError,
    OpenError,
    StuckError,
    UringTierError,
)

LIBRARY_ENV = "URINGTIER_LIBRARY"
"""Environment variable naming the library to load instead of the one inside the package."""

ABI_VERSION = 4  # UT_ABI_VERSION in uringtier.h

# Error codes (enum ut_error).
EBUSY, ECLOSED, EINVAL, EOPTIONS, EHANDLE, ESTUCK, EFORK, EIO, ERANGE, EARG, EBROKEN = range(-1, -12, -1)

_ERRORS: dict[int, type[UringTierError]] = {
    EBUSY: BusyError,
    ECLOSED: ClosedError,
    EINVAL: InvalidRequestError,
    EOPTIONS: InvalidOptionsError,
    EHANDLE: ClosedError,
    ESTUCK: StuckError,
    EFORK: ForkedError,
    EIO: OpenError,
    EARG: InvalidRequestError,
    EBROKEN: BrokenError,
}


class ut_result(ctypes.Structure):
    """struct ut_result of uringtier.h."""

    _fields_ = [
        ("req", c_uint64),
        ("op", c_uint32),
        ("keys", c_uint32),
        ("first", c_uint32),
        ("prefix", c_uint32),
        ("held", c_uint32),
        ("reserved", c_uint32),
    ]


class ut_gauges(ctypes.Structure):
    """struct ut_gauges of uringtier.h."""

    _fields_ = [
        ("in_flight", c_uint64),
        ("queued", c_uint64),
        ("stuck", c_uint64),
        ("held", c_uint64),
        ("breaker_open", c_uint32),
        ("reserved", c_uint32),
    ]


# name: (restype, argtypes, waits): the functions of uringtier.h.
_PROTOTYPES = {
    "ut_abi_version": (c_int, [], False),
    "ut_strerror": (c_char_p, [c_int], False),
    "ut_last_error": (c_char_p, [], False),
    "ut_open": (c_int, [c_char_p, c_char_p, POINTER(c_uint64)], True),
    "ut_buffers_size": (c_size_t, [c_size_t, c_size_t], False),
    "ut_open_buffers": (c_int, [c_char_p, c_char_p, c_void_p, c_size_t, c_size_t, POINTER(c_uint64)], True),
    "ut_buffers": (c_int, [c_uint64, POINTER(c_void_p), c_size_t], False),
    "ut_lookup": (c_int, [c_uint64, c_uint64, c_char_p, c_size_t, c_void_p, c_size_t], False),
    "ut_lookup_prefix": (c_int, [c_uint64, c_uint64, c_char_p, c_size_t, c_void_p, c_size_t], False),
    "ut_delete": (c_int, [c_uint64, c_uint64, c_char_p, c_size_t, c_void_p, c_size_t], False),
    "ut_load": (c_int, [c_uint64, c_uint64, c_char_p, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t], False),
    "ut_store": (c_int, [c_uint64, c_uint64, c_char_p, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t], False),
    "ut_poll": (c_int, [c_uint64, POINTER(ut_result), c_size_t, POINTER(c_uint8), c_size_t], False),
    "ut_fd": (c_int, [c_uint64], False),
    "ut_cancel": (c_int, [c_uint64, c_uint64], False),
    "ut_close": (c_int, [c_uint64, c_int64], True),
    "ut_free": (c_int, [c_uint64], True),
    "ut_read_gauges": (c_int, [c_uint64, POINTER(ut_gauges)], False),
    "ut_stats": (c_int, [c_uint64, c_char_p, c_size_t], False),
    "ut_engine": (c_int, [c_uint64, c_char_p, c_size_t], False),
    "ut_exists": (c_int, [c_char_p, c_size_t, c_size_t, c_int64, POINTER(c_uint8)], True),
}


class Library:
    """The loaded library: one attribute per function of uringtier.h (ut_open, ut_lookup, …)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pid = os.getpid()
        try:
            keep_gil = ctypes.PyDLL(path)
            release_gil = ctypes.CDLL(path)
        except OSError as e:
            raise LibraryNotFoundError(
                f"uringtier: cannot load {path}: {e}; build it with `make python` or set {LIBRARY_ENV}"
            ) from e
        for name, (restype, argtypes, waits) in _PROTOTYPES.items():
            fn = getattr(release_gil if waits else keep_gil, name)
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)
        if self.ut_abi_version() != ABI_VERSION:
            raise LibraryNotFoundError(
                f"uringtier: {path} has ABI version {self.ut_abi_version()}, this package wants {ABI_VERSION}:"
                " rebuild it with `make python`"
            )

    def error(self, code: int, what: str = "") -> UringTierError:
        """The exception for a negative return code, with the calling thread's last error message."""
        detail = self.ut_last_error().decode(errors="replace") or self.ut_strerror(code).decode()
        cls = _ERRORS.get(code, UringTierError)
        return cls(f"{what}: {detail}" if what else detail, code)

    def _disable(self) -> None:
        """Runs in a child forked after loading: every function now raises ForkedError."""
        message = (
            f"uringtier: process {os.getpid()} was forked from process {self.pid} after liburingtier"
            " was loaded there, and the Go runtime inside the library does not survive fork: load it"
            ' after the fork (multiprocessing start method "spawn" or "forkserver")'
        )

        def forked(*args: object) -> int:
            raise ForkedError(message, EFORK)

        for name in _PROTOTYPES:
            setattr(self, name, forked)


_lock = threading.Lock()
_library: Library | None = None
_forked_from: int | None = None  # set in a child forked after loading


def _after_fork_in_child() -> None:
    global _forked_from
    if _library is not None:
        _forked_from = _library.pid
        _library._disable()


def millis(timeout: float) -> int:
    """A timeout in seconds as the library's int64 milliseconds: none below 0, and one too long
    for it (infinity too) as the longest, which waits as long as it takes."""
    if timeout != timeout:
        raise ValueError("timeout is NaN")
    return max(0, round(min(timeout, 1e15) * 1000))


def library_path() -> str:
    """The library that load() opens: $URINGTIER_LIBRARY, else liburingtier.so inside the package."""
    return os.environ.get(LIBRARY_ENV) or os.path.join(os.path.dirname(os.path.abspath(__file__)), "liburingtier.so")


def load() -> Library:
    """Returns the library, loading it on the first call in this process.

    Raises ForkedError in a child forked after it was loaded, LibraryNotFoundError if it is missing.
    """
    global _library
    lib = _library
    if lib is None:
        with _lock:
            if _library is None:
                path = library_path()
                if not os.path.exists(path):
                    raise LibraryNotFoundError(
                        f"uringtier: {path} not found: build it with `make python` or set {LIBRARY_ENV}"
                    )
                _library = Library(path)
                os.register_at_fork(after_in_child=_after_fork_in_child)
            lib = _library
    if _forked_from is not None:
        lib.ut_abi_version()  # raises ForkedError
    return lib


def loaded() -> bool:
    """Whether this process has loaded the library (in a forked child: whether its parent had)."""
    return _library is not None
