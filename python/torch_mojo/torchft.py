"""torchft on `mojo`: the process group torchft's Manager rebuilds across
replica groups at every quorum change, as its ProcessGroupGloo does, and
torchft's DistributedDataParallel with its comm hook made safe for a
failed all-reduce.

    from torch_mojo.torchft import DistributedDataParallel, ProcessGroupMojo
    manager = torchft.Manager(pg=ProcessGroupMojo(), ...)
    model = DistributedDataParallel(manager, model)

torchft (pip install torchft) drives it: at each new quorum it aborts the
group it had and calls configure(), which builds a `mojo` group of the
quorum's replicas from torchft's store. A peer that dies or stalls makes
the group's calls fail, in the caller, so that torchft can drop the
replica and go on: the watchdog does not end the process, as it does for
a group of init_process_group.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch._C._distributed_c10d import ErrorType
from torch.distributed import ProcessGroup as BaseProcessGroup
from torchft import ddp
from torchft.process_group import ProcessGroupWrapper

from torch_mojo._registration import make_backend
from torch_mojo.libraries import current_accelerator


class ProcessGroupMojo(ProcessGroupWrapper):
    """A reconfigurable `mojo` process group for torchft."""

    _backend = None  # the group of the current quorum's, once configured

    def _create_pg(self, store, rank: int, world_size: int) -> BaseProcessGroup:
        # torchft's store holds this quorum's keys alone, and its replica
        # groups are torchrun jobs of their own, each restarted apart.
        backend = make_backend(store, rank, world_size, self._timeout, self._global_ranks or (), group_store=True)
        backend._raise_errors_in_caller()
        self._backend = backend
        group = BaseProcessGroup(store, rank, world_size)
        custom = BaseProcessGroup.BackendType.CUSTOM
        group._set_default_backend(custom)
        group._register_backend(torch.device("cpu"), custom, backend)
        accelerator = current_accelerator()  # the device make_backend made the group for
        if accelerator is not None:
            group._register_backend(accelerator, custom, backend)
        return group

    def errored(self) -> Optional[Exception]:
        """The failure that makes this group unusable (a peer gone, a call
        timed out), for torchft to reconfigure on; None while it is sound."""
        error = self._backend.get_error() if self._backend is not None else ErrorType.SUCCESS
        return None if error == ErrorType.SUCCESS else RuntimeError(f"the mojo process group failed ({error.name})")

    def getBackendName(self) -> str:
        return "torchft-mojo"


class DistributedDataParallel(ddp.DistributedDataParallel):
    """torchft's DistributedDataParallel, whose comm hook (torchft 0.2.0)
    asserts on the future of an all-reduce that failed: where a peer group
    dies mid all-reduce, on gloo as on mojo, the healthy group's process
    then ends too (torchrun restarts it). Here a failed all-reduce gives
    the bucket back as it is: torchft has recorded the error, and the step
    will not be committed."""

    @staticmethod
    def _comm_hook(state, bucket):
        work = state.allreduce(bucket.buffer())
        if work.wait():
            future = work.get_future()
            return getattr(future, "_fut", None) or future
        unchanged = torch.futures.Future()
        unchanged.set_result(bucket.buffer())
        return unchanged
