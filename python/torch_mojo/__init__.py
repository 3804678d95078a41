"""torch-mojo: the ``mojo`` backend for ``torch.distributed``.

Importing this package changes nothing: call :func:`register_mojo_devices`
to make ``mojo`` the default backend, and
:func:`torch_mojo.distributed.use_local_rank_gpu` first thing in a script
to give each worker its own GPU.
"""

__version__ = "0.1.0"


def register_mojo_devices():
    """Registers the ``mojo`` process-group backend with torch.distributed.

    After it, ``dist.get_default_backend_for_device("cpu")`` is ``"mojo"``
    and ``dist.init_process_group(backend="mojo")`` works. It also checks
    the ``TORCH_MOJO_BACKEND_*`` and ``MOJOCCL_*`` variables: unknown names
    are warned about (with the closest real name), bad values raise.
    Calling it again does nothing more.
    """
    from torch_mojo._registration import register

    register()


def set_deterministic(enabled=True):
    """Makes every floating-point sum, average and product of all_reduce,
    reduce and reduce_scatter on the ``mojo`` process groups made after it
    the rank-order one, ``((x0 + x1) + x2) + ...`` in the tensor's own
    dtype: the same bits whatever the layout of ranks on nodes
    (``MOJOCCL_DETERMINISTIC``, docs/reproducible.md). Call it on every
    rank, before ``init_process_group``; ranks that differ fail at once.
    ``torch.use_deterministic_algorithms(True)`` turns it on too, unless
    ``MOJOCCL_DETERMINISTIC`` is set."""
    import os

    os.environ["MOJOCCL_DETERMINISTIC"] = "1" if enabled else "0"


__all__ = ["register_mojo_devices", "set_deterministic", "__version__"]
