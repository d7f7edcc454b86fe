"""Exceptions raised by uringtier, one per error code of the C library."""

from __future__ import annotations

__all__ = [
    "UringTierError",
    "BusyError",
    "ClosedError",
    "InvalidRequestError",
    "InvalidOptionsError",
    "StuckError",
    "ForkedError",
    "OpenError",
    "BrokenError",
    "LibraryNotFoundError",
]


class UringTierError(Exception):
    """Base of every uringtier error; ``code`` is the C library's error code (negative), or 0."""

    code: int = 0

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class BusyError(UringTierError):
    """The tier's depth is full: nothing was queued. Poll, then retry (back-pressure, not a failure)."""

    code = -1


class ClosedError(UringTierError):
    """The tier is closed (or its handle was freed)."""

    code = -2


class InvalidRequestError(UringTierError, ValueError):
    """A request the tier refuses: key size, buffer size, too many keys, a request ID in flight."""

    code = -3


class InvalidOptionsError(UringTierError, ValueError):
    """Options that the tier rejects when opening."""

    code = -4


class StuckError(UringTierError):
    """close() reached its timeout while a hung filesystem still held operations.

    The tier is closed all the same; buffers of loads and stores still held by the kernel stay
    pinned until their release (see Tier.poll and Result.held).
    """

    code = -6


class ForkedError(UringTierError, RuntimeError):
    """This process was forked after the library was loaded, and the Go runtime inside it does not
    survive fork. Load it after the fork: use multiprocessing's "spawn" (or "forkserver") start
    method, or create the Tier in the child only."""

    code = -7


class OpenError(UringTierError, OSError):
    """Tier() could not set up the directory or the engine (engine="uring" where io_uring is
    unusable, say); the message says why."""

    code = -8


class BrokenError(UringTierError, OSError):
    """The tier's IO engine failed (an io_uring instance the kernel stopped accepting): keys in flight
    end Status.FAILED and every later submit raises this. Close the tier and open a new one."""

    code = -11


class LibraryNotFoundError(UringTierError, ImportError):
    """liburingtier.so is missing: build it with ``make python`` (or set URINGTIER_LIBRARY)."""
