"""libmojoccl through its C API (ctypes), without torch's process group in
between: what `torch-mojo bench` measures as "the library alone", and what
the tests use to drive the library directly.

Buffers may be torch tensors or numpy arrays (contiguous, on the CPU).
"""

from __future__ import annotations

import ctypes

from torch_mojo._paths import mojoccl_path

SUCCESS, SYSTEM_ERROR, INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR = 0, 2, 3, 4, 5, 6
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4

# ncclDataType_t codes, by dtype name (torch's and numpy's agree on these).
DATATYPES = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
    "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9, "bool": 1,
}


class CclError(RuntimeError):
    def __init__(self, code, message):
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]

    @classmethod
    def of(cls, uid: bytes) -> "UniqueId":
        value = cls()
        ctypes.memmove(ctypes.addressof(value), uid, 128)
        return value


class Rehearsal(ctypes.Structure):
    """mojocclRehearsal (nccl.h)."""
    _fields_ = [(name, ctypes.c_int) for name in ("nranks", "first", "count", "rounds", "gathers")] + [
        ("gatherBytes", ctypes.c_uint64), ("leaver", ctypes.c_int)]


def _address(buffer):
    return buffer.data_ptr() if hasattr(buffer, "data_ptr") else buffer.ctypes.data


def _count(buffer):
    return buffer.numel() if hasattr(buffer, "numel") else buffer.size


def datatype_of(buffer) -> int:
    name = str(buffer.dtype).removeprefix("torch.")
    return DATATYPES[name]


class Library:
    def __init__(self, path=None):
        self.lib = lib = ctypes.CDLL(path or mojoccl_path())
        self._parts = {}  # (part, nranks): the arrays _equal_parts hands out by address
        pointer, size, comm, code = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
        lib.ncclGetLastError.restype = ctypes.c_char_p
        lib.ncclGetLastError.argtypes = [comm]
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(comm), code, UniqueId, code]
        for name in ("ncclCommDestroy", "ncclCommAbort"):
            getattr(lib, name).argtypes = [comm]
        lib.ncclCommGetAsyncError.argtypes = [comm, ctypes.POINTER(code)]
        lib.ncclAllReduce.argtypes = [pointer, pointer, size, code, code, comm, pointer]
        lib.ncclReduce.argtypes = [pointer, pointer, size, code, code, code, comm, pointer]
        lib.ncclBroadcast.argtypes = [pointer, pointer, size, code, code, comm, pointer]
        lib.ncclAllGather.argtypes = [pointer, pointer, size, code, comm, pointer]
        lib.ncclReduceScatter.argtypes = [pointer, pointer, size, code, code, comm, pointer]
        lib.ncclMemAlloc.argtypes = [ctypes.POINTER(pointer), size]
        lib.ncclMemFree.argtypes = [pointer]
        lib.ncclSend.argtypes = [pointer, size, code, code, comm, pointer]
        lib.ncclRecv.argtypes = [pointer, size, code, code, comm, pointer]
        sizes = ctypes.POINTER(size)
        lib.ncclAllToAllv.argtypes = [pointer, sizes, sizes, pointer, sizes, sizes, code, comm, pointer]
        # The same, taking its arrays' addresses: ctypes checks four arrays
        # against `sizes` in about half a microsecond a call, which would
        # count against the library in a benchmark.
        self._all_to_all_by_address = ctypes.CFUNCTYPE(code, pointer, pointer, pointer, pointer, pointer, pointer,
                                                       code, comm, pointer)(("ncclAllToAllv", lib))
        lib.mojocclWireSendRecv.argtypes = [pointer, code, pointer, code, size, comm]
        lib.mojocclPredictAllReduce.argtypes = [code, size, ctypes.c_char_p, ctypes.c_char_p, size,
                                                ctypes.POINTER(ctypes.c_double)]
        lib.mojocclPredictBroadcast.argtypes = [code, size, ctypes.c_char_p, size, ctypes.POINTER(ctypes.c_double)]
        lib.mojocclCommRejected.argtypes = [comm, ctypes.POINTER(ctypes.c_uint64)]
        lib.mojocclCommSetupSeconds.argtypes = [comm, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(code)]
        lib.mojocclCommSetupTraffic.argtypes = [comm, ctypes.POINTER(code), ctypes.POINTER(ctypes.c_uint64)]
        lib.mojocclSettings.restype = ctypes.c_char_p
        lib.mojocclSettings.argtypes = []
        lib.mojocclDescribeFabric.argtypes = [code, ctypes.c_char_p, size]
        lib.mojocclFabricAutoProviders.restype = ctypes.c_char_p
        lib.mojocclFabricAutoProviders.argtypes = []
        lib.mojocclPreloadFabric.argtypes = []
        lib.mojocclRehearseBootstrap.argtypes = [ctypes.POINTER(UniqueId), ctypes.POINTER(Rehearsal),
                                                 ctypes.POINTER(ctypes.c_double), ctypes.POINTER(code),
                                                 ctypes.c_char_p, size]

    def check(self, code):
        if code != SUCCESS:
            raise CclError(code, self.lib.ncclGetLastError(None).decode())

    def settings(self):
        """libmojoccl's table of the MOJOCCL_* variables it reads: name ->
        (kind, default, what it accepts)."""
        lines = self.lib.mojocclSettings().decode().splitlines()
        return {name: (kind, default, accepts) for name, kind, default, accepts in (line.split("\t") for line in lines)}

    def fabric_auto_providers(self) -> tuple[str, ...]:
        """The providers MOJOCCL_FABRIC_PROVIDER=auto tries, in order."""
        return tuple(self.lib.mojocclFabricAutoProviders().decode().split(","))

    def describe_fabric(self, local_rank: int) -> str:
        """What a communicator spanning nodes would open on the node's
        `local_rank`th rank ("tcp;ofi_rxm on lo (libfabric 1.17, ...)");
        CclError says why it could not."""
        text = ctypes.create_string_buffer(1024)
        self.check(self.lib.mojocclDescribeFabric(local_rank, text, len(text)))
        return text.value.decode()

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
        self.check(self.lib.ncclCommInitRank(ctypes.byref(handle), nranks, UniqueId.of(uid), rank))
        return handle

    def preload_fabric(self) -> None:
        """Starts loading libfabric in the background (nccl.h, mojocclPreloadFabric)."""
        self.check(self.lib.mojocclPreloadFabric())

    def rehearse_bootstrap(self, uid: bytes, nranks: int, ranks: range, rounds: int, gathers: int,
                           gather_bytes: int, leaver: int = -1) -> list[tuple[float, int, str]]:
        """The bootstrap of `ranks` of an nranks communicator, each a thread
        of this process, with a set-up's exchanges (nccl.h,
        mojocclRehearseBootstrap): (seconds, ncclResult_t, message) a rank."""
        plan = Rehearsal(nranks, ranks.start, len(ranks), rounds, gathers, gather_bytes, leaver)
        count, message_bytes = len(ranks), 512
        seconds, results = (ctypes.c_double * count)(), (ctypes.c_int * count)()
        messages = ctypes.create_string_buffer(count * message_bytes)
        self.check(self.lib.mojocclRehearseBootstrap(ctypes.byref(UniqueId.of(uid)), ctypes.byref(plan), seconds,
                                                     results, messages, message_bytes))
        texts = [messages.raw[i * message_bytes:(i + 1) * message_bytes].split(b"\0")[0].decode() for i in range(count)]
        return list(zip(seconds, results, texts))

    def shared_tensor(self, count, dtype=None):
        """A tensor of `count` elements in ncclMemAlloc memory, which peers read
        in place. The memory is freed with the tensor."""
        import torch

        dtype = dtype or torch.float32
        size = count * torch.empty(0, dtype=dtype).element_size()
        address = ctypes.c_void_p()
        self.check(self.lib.ncclMemAlloc(ctypes.byref(address), max(size, 1)))
        storage = (ctypes.c_byte * max(size, 1)).from_address(address.value)
        tensor = torch.frombuffer(storage, dtype=torch.uint8)[:size].view(dtype)
        free = self.lib.ncclMemFree
        import weakref

        weakref.finalize(tensor, free, address.value)
        return tensor

    def destroy(self, comm):
        self.check(self.lib.ncclCommDestroy(comm))

    def all_reduce(self, comm, send, recv, op=SUM, count=None, datatype=None):
        self.check(self.lib.ncclAllReduce(
            _address(send), _address(recv), _count(send) if count is None else count,
            datatype_of(send) if datatype is None else datatype, op, comm, None))

    def broadcast(self, comm, buffer, root):
        self.check(self.lib.ncclBroadcast(_address(buffer), _address(buffer), _count(buffer),
                                          datatype_of(buffer), root, comm, None))

    def all_gather(self, comm, send, recv):
        self.check(self.lib.ncclAllGather(_address(send), _address(recv), _count(send),
                                          datatype_of(send), comm, None))

    def reduce_scatter(self, comm, send, recv, op=SUM):
        self.check(self.lib.ncclReduceScatter(_address(send), _address(recv), _count(recv),
                                              datatype_of(recv), op, comm, None))

    def send(self, comm, buffer, peer):
        self.check(self.lib.ncclSend(_address(buffer), _count(buffer), datatype_of(buffer), peer, comm, None))

    def recv(self, comm, buffer, peer):
        self.check(self.lib.ncclRecv(_address(buffer), _count(buffer), datatype_of(buffer), peer, comm, None))

    def wire_send_recv(self, comm, send, to, recv, source):
        """`send` to rank `to` and as many bytes from rank `source` into
        `recv` (both on other nodes), straight on the fabric endpoint: the
        provider's own point-to-point."""
        nbytes = send.numel() * send.element_size()
        self.check(self.lib.mojocclWireSendRecv(_address(send), to, _address(recv), source, nbytes, comm))

    def all_to_all(self, comm, send, recv, nranks):
        """Equal parts, in one ncclAllToAllv."""
        counts, displacements = self._equal_parts(_count(send) // nranks, nranks)
        self.check(self._all_to_all_by_address(_address(send), counts, displacements, _address(recv), counts,
                                               displacements, datatype_of(send), comm, None))

    def _equal_parts(self, part, nranks):
        """The addresses of the counts and displacements of equal parts,
        made once (and kept): built per call they would cost a microsecond
        that no caller in C pays."""
        if (part, nranks) not in self._parts:
            self._parts[part, nranks] = ((ctypes.c_size_t * nranks)(*([part] * nranks)),
                                         (ctypes.c_size_t * nranks)(*(peer * part for peer in range(nranks))))
        return tuple(ctypes.addressof(array) for array in self._parts[part, nranks])

    def predict_all_reduce(self, nodes, nbytes, algorithm=None):
        """The cost model between nodes: (algorithm, seconds) for `nodes`
        leaders and `nbytes`; `algorithm` None: the one MOJOCCL_NET_ALGO
        lets the model choose."""
        chosen, seconds = ctypes.create_string_buffer(64), ctypes.c_double()
        self.check(self.lib.mojocclPredictAllReduce(nodes, nbytes, algorithm.encode() if algorithm else None, chosen,
                                                    len(chosen), ctypes.byref(seconds)))
        return chosen.value.decode(), seconds.value

    def predict_broadcast(self, nodes, nbytes):
        """The same for a broadcast between nodes: ("ring" or "tree", seconds)."""
        chosen, seconds = ctypes.create_string_buffer(64), ctypes.c_double()
        self.check(self.lib.mojocclPredictBroadcast(nodes, nbytes, chosen, len(chosen), ctypes.byref(seconds)))
        return chosen.value.decode(), seconds.value

    def setup_seconds(self, comm) -> list[float]:
        """How long this rank's set-up of `comm` took, phase by phase: the
        bootstrap, the node's shared memory, the settings, the fabric
        endpoint, the peer watch (nccl.h, mojocclCommSetupSeconds)."""
        seconds, count = (ctypes.c_double * 8)(), ctypes.c_int(8)
        self.check(self.lib.mojocclCommSetupSeconds(comm, seconds, ctypes.byref(count)))
        return list(seconds[: count.value])

    def setup_traffic(self, comm) -> tuple[int, int]:
        """(the exchanges over the bootstrap's tree after the table of
        ranks, the bytes this rank put into them) of `comm`'s set-up."""
        rounds, count = ctypes.c_int(), ctypes.c_uint64()
        self.check(self.lib.mojocclCommSetupTraffic(comm, ctypes.byref(rounds), ctypes.byref(count)))
        return rounds.value, count.value

    def rejected(self, comm):
        """Connections and messages from outside `comm` it turned away (docs/security.md)."""
        count = ctypes.c_uint64()
        self.check(self.lib.mojocclCommRejected(comm, ctypes.byref(count)))
        return count.value

    def async_error(self, comm):
        value = ctypes.c_int()
        self.check(self.lib.ncclCommGetAsyncError(comm, ctypes.byref(value)))
        return value.value
