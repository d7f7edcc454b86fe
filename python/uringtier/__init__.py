"""uringtier: a storage tier for fixed-size blocks (LLM KV-cache blocks, say), kept as files and
looked up, loaded and stored through io_uring, for Python inference servers.

A scheduler thread submits and polls; the IO runs on the library's own threads, which never need
the GIL::

    import uringtier

    with uringtier.Tier("/mnt/nvme/kv", block_size=2 << 20, namespace="llama-70b") as tier:
        tier.lookup(1, keys)                  # returns at once
        ...                                   # once per scheduler step:
        for result in tier.poll():            # never waits
            hits = result.prefix              # leading keys found

Importing this package does not load liburingtier.so; the first Tier() or batch_exists() does.
The library carries a Go runtime, which does not survive fork: in a process forked after it was
loaded, every call raises ForkedError (use multiprocessing's "spawn" start method, or load it only
in the children).
"""

__version__ = "0.1.0"

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
from .exists import batch_exists, batch_status
from .tier import EngineInfo, Gauges, Op, Result, Status, Tier

__all__ = [
    "Tier",
    "Result",
    "Status",
    "Op",
    "EngineInfo",
    "Gauges",
    "batch_exists",
    "batch_status",
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
