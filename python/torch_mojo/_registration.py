"""register_mojo_devices(): the backend's registration with torch.distributed."""

import atexit
import os
import threading

from torch_mojo import launcher, libraries
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


def _follow_torch_determinism():
    """torch.use_deterministic_algorithms(True) asks for reproducible
    results: the group's sums become the rank-order ones, unless
    MOJOCCL_DETERMINISTIC says otherwise."""
    import torch

    if torch.are_deterministic_algorithms_enabled() and not os.environ.get("MOJOCCL_DETERMINISTIC"):
        os.environ["MOJOCCL_DETERMINISTIC"] = "1"


def _create_backend(backend_options, _pg_options):
    """What c10d asks of a registered backend (init_process_group, new_group)."""
    return make_backend(backend_options.store, backend_options.group_rank, backend_options.group_size,
                       backend_options.timeout, list(backend_options.global_ranks_in_group))


def make_backend(store, rank, size, timeout, global_ranks=(), group_store=False):
    """One process group for CPU tensors and, where there is one, for the
    accelerator's: c10d makes a single backend when every device maps to
    mojo. Its communicator on the accelerator is made now, on the current
    device, with the library the guide's search order finds. `group_store`:
    the store is this group's alone (torchft's), not a job's under the
    group's prefix."""
    _C = _load_core()
    _follow_torch_determinism()
    device = libraries.current_accelerator()
    library_path, library_kind = libraries.accelerator_library(device.type) if device else ("", "")
    return _C.ProcessGroupMojo(store, rank, size, timeout, list(global_ranks), device=device,
                               library_path=library_path, library_kind=library_kind, group_store=group_store)


def _install_trace_dumps(_C):
    """torch._C._distributed_c10d._dump_nccl_trace (and _json) return this
    backend's flight recorder while a mojo process group is alive, and
    PyTorch's own dump otherwise (the CPU build has none: it gets these
    names from here, falling back to _dump_fr_trace)."""
    import torch._C._distributed_c10d as c10d

    torch_pickle = getattr(c10d, "_dump_nccl_trace", None) or c10d._dump_fr_trace
    torch_json = getattr(c10d, "_dump_nccl_trace_json", None) or c10d._dump_fr_trace_json

    def _dump_nccl_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False):
        if _C._groups_alive():
            return _C._dump_trace(includeCollectives, includeStackTraces, onlyActive)
        return torch_pickle(includeCollectives, includeStackTraces, onlyActive)

    def _dump_nccl_trace_json(includeCollectives=True, onlyActive=False):
        if _C._groups_alive():
            return _C._dump_trace_json(includeCollectives, onlyActive)
        return torch_json(includeCollectives, onlyActive)

    c10d._dump_nccl_trace = _dump_nccl_trace
    c10d._dump_nccl_trace_json = _dump_nccl_trace_json


def _fix_shrink_group():
    """Two faults of torch 2.13's shrink_group, mended for mojo groups:

    - it registers the new group's CPU backend as BackendType.GLOO whatever
      it is, and DDP then takes a shrunk mojo group for gloo's class (a
      crash in its logger): a shrunk mojo group is registered as CUSTOM, as
      init_process_group registers it;
    - it takes ranks_to_exclude (group ranks) for global ranks when it lists
      the new group's members, so shrinking a group whose ranks are not its
      global ranks (any subgroup, or a default group shrunk before) records
      the wrong members: they are translated to global ranks first.
    """
    import torch
    from torch.distributed import distributed_c10d as c10d

    create, finalize = c10d._create_shrunk_process_group, c10d._finalize_shrunk_group
    if getattr(create, "_mojo", False):
        return

    def is_mojo(group):
        return c10d._world.pg_map[group][0] == BACKEND_NAME

    def create_shrunk(new_backend, remaining_ranks, metadata, is_default_group):
        group = create(new_backend, remaining_ranks, metadata, is_default_group)
        if metadata["backend_name"] == BACKEND_NAME:
            custom = c10d.ProcessGroup.BackendType.CUSTOM
            device = metadata.get("bound_device_id") or torch.device("cpu")
            group._register_backend(device, custom, new_backend)
            group._set_default_backend(custom)
        return group

    def finalize_shrunk(group_info, excluded_ranks, new_backend):
        group = group_info["process_group"]
        if is_mojo(group):
            members = c10d.get_process_group_ranks(group)
            excluded_ranks = {members[rank] for rank in excluded_ranks}
        return finalize(group_info, excluded_ranks, new_backend)

    create_shrunk._mojo = True
    c10d._create_shrunk_process_group = create_shrunk
    c10d._finalize_shrunk_group = finalize_shrunk


ACCELERATE_TAKES_GLOO = (
    "accelerate is making the default process group on gloo: on CPU, Accelerator() and the Hugging Face "
    "Trainer take gloo whatever backend they are given (backend=\"mojo\" is refused). To train on mojo, "
    "make the group first: torch.distributed.init_process_group(\"mojo\") before Accelerator() or the "
    "Trainer, and they keep it (docs/integrations.md)"
)


def _warn_when_accelerate_takes_gloo():
    """init_process_group, as before, with a warning where accelerate calls
    it for gloo on a machine where mojo is the CPU's default: the one place
    that choice is made silently. Nothing else changes."""
    import functools
    import sys
    import warnings

    import torch.distributed as dist

    init = dist.init_process_group
    if getattr(init, "_mojo", False):
        return

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend", args[0] if args else None)
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if backend == "gloo" and caller.split(".")[0] == "accelerate" and \
                dist.Backend.default_device_backend_map.get("cpu") == BACKEND_NAME:
            warnings.warn(ACCELERATE_TAKES_GLOO, stacklevel=2)
        return init(*args, **kwargs)

    init_process_group._mojo = True
    dist.init_process_group = init_process_group


def _devices():
    """cpu, and this process's accelerator type where it has one (cuda or
    mojo): mojo becomes the default backend of both."""
    kind = libraries.accelerator_type()
    return ["cpu"] + ([kind] if kind else [])


def _preload_fabric_where_the_job_spans_nodes():
    """A job across nodes starts loading libfabric now, in the background,
    rather than at its first communicator: a process's load takes hundreds
    of ms where provider libraries probe for their hardware."""
    if launcher.spans_nodes():
        from torch_mojo.mojoccl import Library

        Library().preload_fabric()


def register():
    global _registered
    check_environment()
    # srun or mpirun instead of torchrun: torch's init_process_group() then
    # finds torchrun's variables all the same.
    launcher.adopt_launcher_environment()
    with _lock:
        if _registered:
            return
        import torch.distributed as dist

        _C = _load_core()
        devices = _devices()
        dist.Backend.register_backend(
            BACKEND_NAME, _create_backend, extended_api=True, devices=devices
        )
        # register_backend keeps an existing default (gloo for cpu); the
        # point of registering is to make mojo the default.
        for device in devices:
            dist.Backend.default_device_backend_map[device] = BACKEND_NAME
        _install_trace_dumps(_C)
        _fix_shrink_group()
        _warn_when_accelerate_takes_gloo()
        # A collective still running when the script ends gets two seconds,
        # then is reported; Ctrl-C reaches the watchdog too.
        atexit.register(_C._before_exit)
        _C._watch_for_interrupts()
        _preload_fabric_where_the_job_spans_nodes()
        _registered = True
