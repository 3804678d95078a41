"""libmojoccl through its C API (ctypes), for tests that drive the library
without torch's process group in between."""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

from torch_mojo._paths import mojoccl_path

SUCCESS, SYSTEM_ERROR, INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR = 0, 2, 3, 4, 5, 6
DATATYPES = {np.dtype(np.float32): 7, np.dtype(np.float64): 8, np.dtype(np.int32): 2, np.dtype(np.int64): 4}
SUM = 0


class CclError(RuntimeError):
    def __init__(self, code, message):
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class Library:
    def __init__(self, path=None):
        self.lib = lib = ctypes.CDLL(path or mojoccl_path())
        pointer, size, comm = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p
        lib.ncclGetLastError.restype = ctypes.c_char_p
        lib.ncclGetLastError.argtypes = [comm]
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(comm), ctypes.c_int, UniqueId, ctypes.c_int]
        for name in ("ncclCommDestroy", "ncclCommAbort"):
            getattr(lib, name).argtypes = [comm]
        lib.ncclCommGetAsyncError.argtypes = [comm, ctypes.POINTER(ctypes.c_int)]
        lib.ncclAllReduce.argtypes = [pointer, pointer, size, ctypes.c_int, ctypes.c_int, comm, pointer]
        lib.ncclBroadcast.argtypes = [pointer, pointer, size, ctypes.c_int, ctypes.c_int, comm, pointer]
        lib.ncclAllGather.argtypes = [pointer, pointer, size, ctypes.c_int, comm, pointer]
        lib.ncclReduceScatter.argtypes = [pointer, pointer, size, ctypes.c_int, ctypes.c_int, comm, pointer]

    def check(self, code):
        if code != SUCCESS:
            raise CclError(code, self.lib.ncclGetLastError(None).decode())

    def version(self):
        value = ctypes.c_int()
        self.check(self.lib.ncclGetVersion(ctypes.byref(value)))
        return value.value

    def unique_id(self) -> bytes:
        uid = UniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)))
        return ctypes.string_at(ctypes.addressof(uid), 128)

    def init(self, nranks, uid: bytes, rank):
        handle = ctypes.c_void_p()
        value = UniqueId()
        ctypes.memmove(ctypes.addressof(value), uid, 128)
        self.check(self.lib.ncclCommInitRank(ctypes.byref(handle), nranks, value, rank))
        return handle

    def all_reduce(self, comm, send, recv, op=SUM, count=None, datatype=None):
        self.check(self.lib.ncclAllReduce(
            send.ctypes.data, recv.ctypes.data, send.size if count is None else count,
            DATATYPES[send.dtype] if datatype is None else datatype, op, comm, None))

    def async_error(self, comm):
        value = ctypes.c_int()
        self.check(self.lib.ncclCommGetAsyncError(comm, ctypes.byref(value)))
        return value.value


def shared_unique_id(library: Library, rank: int, scratch: str, timeout=30) -> bytes:
    """Rank 0 makes the unique id; the others read it from a file, as a
    launcher's store would carry it."""
    path = os.path.join(scratch, "unique_id")
    if rank == 0:
        uid = library.unique_id()
        with open(path + ".tmp", "wb") as file:
            file.write(uid)
        os.rename(path + ".tmp", path)
        return uid
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError("rank 0 never published the unique id")
        time.sleep(0.01)
    with open(path, "rb") as file:
        return file.read()
