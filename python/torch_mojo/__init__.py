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


__all__ = ["register_mojo_devices", "__version__"]
