"""Helpers for distributed scripts. This module does not import torch, so
that :func:`use_local_rank_gpu` can run before anything touches a GPU."""

import os
import sys
import time
import warnings

from torch_mojo import launcher

_VISIBILITY = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES"}


_DEVICE_FILES = {
    "amd": ["/dev/kfd"],
    "nvidia": ["/dev/nvidiactl", "/proc/driver/nvidia/version"],
}


def _vendor_from_environment():
    for vendor, variable in _VISIBILITY.items():
        if variable in os.environ:
            return vendor
    return None


def gpu_vendor():
    """The GPU vendor of this node: from its device files, else from which
    visibility variable a launcher exported; None without a GPU."""
    for vendor, paths in _DEVICE_FILES.items():
        if any(os.path.exists(path) for path in paths):
            return vendor
    return _vendor_from_environment()


def _gpus_already_initialised():
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return bool(getattr(torch.cuda, "is_initialized", lambda: False)())


def use_local_rank_gpu():
    """Gives this torchrun worker its own GPU, chosen by ``LOCAL_RANK`` (a
    task of srun or mpirun: by its launcher's local rank, see
    :mod:`torch_mojo.launcher`).

    Sets the vendor's visibility variable (``CUDA_VISIBLE_DEVICES`` on
    NVIDIA, ``ROCR_VISIBLE_DEVICES`` on AMD) so that the worker sees exactly
    one GPU, which is then device index 0. A list of several GPUs exported
    by a launcher such as SLURM keeps only this worker's entry; a list of
    one is left alone. Outside torchrun (no ``LOCAL_RANK``), or on a node
    without a GPU, it does nothing.

    Call it first, before ``register_mojo_devices()`` and before anything
    touches the GPU: the GPU list is read once per process.

    Returns the value of the visibility variable it left, or None.
    """
    launcher.adopt_launcher_environment(rendezvous=False)  # srun or mpirun: their local rank
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is None:
        return None
    try:
        index = int(local_rank)
    except ValueError:
        raise ValueError(f"LOCAL_RANK={local_rank!r} is not an integer") from None
    if index < 0:
        raise ValueError(f"LOCAL_RANK={index} is negative")
    vendor = gpu_vendor()
    if vendor is None:
        return None
    variable = _VISIBILITY[vendor]
    current = os.environ.get(variable)
    if current is None:
        os.environ[variable] = str(index)
    else:
        entries = [entry.strip() for entry in current.split(",") if entry.strip()]
        if len(entries) > 1:
            if index >= len(entries):
                raise RuntimeError(
                    f"LOCAL_RANK={index} but {variable}={current} lists only "
                    f"{len(entries)} devices: start at most {len(entries)} processes per "
                    "node, or make more GPUs visible"
                )
            os.environ[variable] = entries[index]
    if _gpus_already_initialised():
        warnings.warn(
            "use_local_rank_gpu() ran after the GPU was initialised, so it has no effect "
            "in this process; call it first thing in the script",
            stacklevel=2,
        )
    return os.environ[variable]


def failed_ranks(group=None, wait=1.0):
    """The ranks of ``group`` (the default group when None) known to have
    failed: ended without destroying or aborting the group (killed, crashed,
    their node lost), or whose script ended while the group was still in
    use (an exception nobody caught), in ascending order, as ranks of
    ``group``. A rank that aborted the group to go on (it shrank it, or its
    collective timed out) is not among them. What to pass
    to ``torch.distributed.shrink_group`` after a collective raised
    (``TORCH_MOJO_BACKEND_PG_WATCHDOG=raise``)::

        except dist.DistBackendError:
            group = dist.shrink_group(failed_ranks(), shrink_flags=dist.SHRINK_ABORT)

    A failure is usually known before the error it causes; where the error
    came first (a connection that broke before the news of its end arrived),
    this waits up to ``wait`` seconds for the first failed rank. An empty
    list means none is known: a rank that is alive but stalled (the
    collective timed out) is not a failed rank.

    A rank that failed is named once its own node (shared memory) or the
    first rank of its node (between nodes) has seen it end; after the group
    was aborted, the ranks known when it was. Groups whose CPU tensors go
    through NCCL or RCCL cannot tell: TypeError.
    """
    backend = _mojo_backend(group, "failed_ranks()")
    deadline = time.monotonic() + wait
    while True:
        ranks = backend.failed_ranks()
        if ranks or time.monotonic() >= deadline:
            return ranks
        time.sleep(0.01)


def turned_away(group=None):
    """How many connections and messages from outside ``group`` (the default
    group when None) this rank has turned away: processes that knocked on
    its ports or sent its endpoint messages without the group's proof or
    key (docs/security.md). Each first one is also logged as a
    ``[mojoccl] WARNING: ... turned away ...`` line. Groups whose CPU
    tensors go through NCCL or RCCL cannot tell: TypeError."""
    return _mojo_backend(group, "turned_away()").turned_away()


def _mojo_backend(group, caller):
    import torch
    import torch.distributed as dist

    from torch_mojo._C import ProcessGroupMojo

    group = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = group._get_backend(torch.device("cpu"))
    if not isinstance(backend, ProcessGroupMojo):
        raise TypeError(f"{caller} reads a mojo process group; this group's backend for CPU tensors "
                        f"is {backend.name()}")
    return backend


__all__ = ["failed_ranks", "turned_away", "use_local_rank_gpu"]
