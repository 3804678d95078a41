"""The registered shared-memory pool.

Tensors from here live in memory that the other ranks of the node can map
(libmojoccl's ncclMemAlloc). A collective whose tensors all come from the
pool reads them in place: no staging copy, about half the memory traffic of
ordinary tensors. They are ordinary CPU tensors otherwise, and their memory
returns to the pool when they are freed.

    import torch_mojo.memory as shared

    grads = shared.empty(1 << 20)            # float32 by default
    dist.all_reduce(grads)                   # peers read it in place

This is also what torch's own hook for a backend's communication memory
returns: ``group._get_backend(torch.device("cpu")).allocate_tensor(n,
dtype=..., device=torch.device("cpu"))``.
"""

from __future__ import annotations

import math


def empty(*size, dtype=None):
    """An uninitialised tensor of `size` (ints or one tuple) from the pool."""
    import torch

    from torch_mojo import _C

    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    tensor = _C._shared_tensor(math.prod(size), dtype or torch.float32)
    return tensor.view(size)


def empty_like(tensor):
    return empty(tuple(tensor.shape), dtype=tensor.dtype)


def copy_of(tensor):
    """A copy of `tensor` in the pool."""
    return empty_like(tensor).copy_(tensor)


def stats() -> dict:
    """Bytes reserved from the library, bytes in live tensors, arenas."""
    from torch_mojo import _C

    return dict(_C._shared_pool_stats())


class _Pool:
    """What `torch-mojo bench` asks of a pool: flat float32 tensors."""

    @staticmethod
    def empty(count):
        return empty(count)


def default_pool():
    return _Pool()


class cpu_tensors_in_pool:
    """Within this block, every CPU tensor torch allocates comes from the pool.

    For tensors that torch creates itself, such as DistributedDataParallel's
    gradient buckets:

        with torch_mojo.memory.cpu_tensors_in_pool():
            model = DDP(model)        # its buckets live in the pool

    torch has one CPU allocator per process, so this affects all threads
    while the block runs; keep it around set-up code.
    """

    def __enter__(self):
        from torch_mojo import _C

        _C._use_pool_for_cpu_tensors(True)
        return self

    def __exit__(self, *exc):
        from torch_mojo import _C

        _C._use_pool_for_cpu_tensors(False)
        return False
