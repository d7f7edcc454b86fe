"""Caller memory for loads and stores: its address and size, pinned until the tier lets go.

Accepted, in this order:

- any object with the buffer protocol (bytearray, memoryview, array.array, mmap, a NumPy array):
  a buffer export is taken with PyObject_GetBuffer and kept until released, so the object cannot be
  resized or freed under the tier (a bytearray refuses to resize while exported);
- an object with ``__array_interface__`` (NumPy's protocol, spoken by many array libraries);
- an object with ``data_ptr()`` and ``nbytes`` (a PyTorch CPU tensor, for example);
- a tuple ``(address, size)`` of raw memory the caller manages.

The memory must be one contiguous range. For the last three kinds only a reference to the object
is kept: the caller must not resize or free its storage while the tier holds it.
"""

from __future__ import annotations

import ctypes
import math
from ctypes import POINTER, c_char_p, c_int, c_void_p, py_object

# Flags of PyObject_GetBuffer (Include/pybuffer.h).
_PyBUF_WRITABLE = 0x0001
_PyBUF_FORMAT = 0x0004
_PyBUF_ND = 0x0008
_PyBUF_STRIDES = 0x0010 | _PyBUF_ND
_PyBUF_ANY_CONTIGUOUS = 0x0080 | _PyBUF_STRIDES


class _Py_buffer(ctypes.Structure):
    """Py_buffer (Include/pybuffer.h), part of the stable ABI since Python 3.11."""

    _fields_ = [
        ("buf", c_void_p),
        ("obj", c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", c_int),
        ("ndim", c_int),
        ("format", c_char_p),
        ("shape", POINTER(ctypes.c_ssize_t)),
        ("strides", POINTER(ctypes.c_ssize_t)),
        ("suboffsets", POINTER(ctypes.c_ssize_t)),
        ("internal", c_void_p),
    ]


_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_GetBuffer.argtypes = [py_object, POINTER(_Py_buffer), c_int]
_GetBuffer.restype = c_int
_CheckBuffer = ctypes.pythonapi.PyObject_CheckBuffer
_CheckBuffer.argtypes = [py_object]
_CheckBuffer.restype = c_int
_Release = ctypes.pythonapi.PyBuffer_Release
_Release.argtypes = [POINTER(_Py_buffer)]
_Release.restype = None


class Pinned:
    """One buffer handed to the tier: ``address`` and ``size`` stay valid until release()."""

    __slots__ = ("address", "size", "_view", "_obj")

    def __init__(self, address: int, size: int, view: _Py_buffer | None, obj: object) -> None:
        self.address = address
        self.size = size
        self._view = view  # a buffer export to release, or None
        self._obj = obj  # keeps the object alive

    def release(self) -> None:
        """Ends the export (the tier no longer uses the memory). Idempotent."""
        if self._view is not None:
            _Release(ctypes.byref(self._view))
            self._view = None
        self._obj = None


def _describe(obj: object) -> str:
    return type(obj).__qualname__


def pin(obj: object, writable: bool, index: int) -> Pinned:
    """Returns obj's memory, pinned. Raises TypeError for an object that is not contiguous memory
    (or not writable memory, when writable), naming the buffer by its index."""
    need = "writable contiguous buffer" if writable else "contiguous buffer"
    if _CheckBuffer(obj):
        view = _Py_buffer()
        flags = _PyBUF_ANY_CONTIGUOUS | (_PyBUF_WRITABLE if writable else 0)
        try:
            _GetBuffer(obj, ctypes.byref(view), flags)
        except (BufferError, TypeError, ValueError) as e:
            raise TypeError(f"buffer {index}: {_describe(obj)} is not a {need}: {e}") from None
        return Pinned(view.buf or 0, view.len, view, obj)
    if isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(v, int) for v in obj):
        address, size = obj
        if address <= 0 or size < 0:
            raise TypeError(f"buffer {index}: (address, size) {obj!r} is not memory")
        return Pinned(address, size, None, obj)
    iface = getattr(obj, "__array_interface__", None)
    if isinstance(iface, dict):
        address, readonly = iface["data"]
        shape = iface["shape"]
        itemsize = int(iface["typestr"][2:])
        strides = iface.get("strides")
        if strides is not None and tuple(strides) != _c_strides(shape, itemsize):
            raise TypeError(f"buffer {index}: {_describe(obj)} is not C-contiguous")
        if writable and readonly:
            raise TypeError(f"buffer {index}: {_describe(obj)} is read-only")
        return Pinned(address, math.prod(shape) * itemsize, None, obj)
    data_ptr = getattr(obj, "data_ptr", None)
    if callable(data_ptr) and isinstance(getattr(obj, "nbytes", None), int):
        is_contiguous = getattr(obj, "is_contiguous", None)
        if callable(is_contiguous) and not is_contiguous():
            raise TypeError(f"buffer {index}: {_describe(obj)} is not contiguous")
        return Pinned(int(data_ptr()), obj.nbytes, None, obj)
    raise TypeError(
        f"buffer {index}: {_describe(obj)} is not a {need} (want the buffer protocol, __array_interface__,"
        " data_ptr() with nbytes, or an (address, size) tuple)"
    )


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    step = itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))
