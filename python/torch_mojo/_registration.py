"""register_mojo_devices(): the backend's registration with torch.distributed."""

import threading

from torch_mojo.env import check_environment

BACKEND_NAME = "mojo"
_lock = threading.Lock()
_registered = False


def _load_core():
    try:
        from torch_mojo import _C
    except ImportError as error:
        import torch

        raise ImportError(
            f"torch-mojo's C++ core failed to load ({error}). It must be built against the "
            f"torch it runs with (torch {torch.__version__} here): reinstall it with "
            "`pip install --no-build-isolation .` from its source tree"
        ) from error
    return _C


def _create_backend(backend_options, _pg_options):
    _C = _load_core()
    return _C.ProcessGroupMojo(
        backend_options.store,
        backend_options.group_rank,
        backend_options.group_size,
        backend_options.timeout,
    )


def _devices():
    # CPU tensors run on libmojoccl. Accelerator tensors are not handled by
    # this version, so no accelerator device type is claimed.
    return ["cpu"]


def register():
    global _registered
    check_environment()
    with _lock:
        if _registered:
            return
        import torch.distributed as dist

        _load_core()
        devices = _devices()
        dist.Backend.register_backend(
            BACKEND_NAME, _create_backend, extended_api=True, devices=devices
        )
        # register_backend keeps an existing default (gloo for cpu); the
        # point of registering is to make mojo the default.
        for device in devices:
            dist.Backend.default_device_backend_map[device] = BACKEND_NAME
        _registered = True
