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
a group of init_process_group. A replica group started with another
value of a setting that must agree, or another number of ranks, is
refused before the group is made (replica_agreement.py): it ends, the
others skip that quorum and train on.

torchft's other way, its own ProcessGroupTorchComms over a torchcomms
communicator that reconfigures rather than being rebuilt:
process_group_through_torchcomms() makes it with a `mojo` communicator.

Around torchft's Manager: require_lighthouse() and
lighthouse_named_on_timeout() make every rank name a Lighthouse that is
not there; manager_store() gives a replica group of several ranks a store
of its own torchrun attempt (examples/torchft/ uses all three).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Optional
from urllib.parse import urlsplit

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ErrorType
from torch.distributed import ProcessGroup as BaseProcessGroup, TCPStore
from torchft import ddp
from torchft.process_group import ProcessGroupWrapper

from torch_mojo._registration import make_backend
from torch_mojo.libraries import current_accelerator
from torch_mojo.replica_agreement import ReplicaFacts, facts_here, judge


class ProcessGroupMojo(ProcessGroupWrapper):
    """A reconfigurable `mojo` process group for torchft."""

    _backend = None  # the group of the current quorum's, once configured
    _quorums = 0  # quorums this process has trained in

    def __init__(self, *args, **kwargs):
        _end_if_refused_before()
        super().__init__(*args, **kwargs)

    def _create_pg(self, store, rank: int, world_size: int) -> BaseProcessGroup:
        _require_agreement(store, rank, world_size, self._replica_id, self._group_world_size, self._quorums)
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
        self._quorums += 1
        return group

    def errored(self) -> Optional[Exception]:
        """The failure that makes this group unusable (a peer gone, a call
        timed out), for torchft to reconfigure on; None while it is sound."""
        error = self._backend.get_error() if self._backend is not None else ErrorType.SUCCESS
        return None if error == ErrorType.SUCCESS else RuntimeError(f"the mojo process group failed ({error.name})")

    def getBackendName(self) -> str:
        return "torchft-mojo"


REFUSED = "torch_mojo/torchft/refused"


def _require_agreement(store, rank: int, world_size: int, replica_id: Optional[str],
                       group_world_size: Optional[int], quorums: int) -> None:
    """Ends this process where its replica group gives way to the others
    (replica_agreement.py); raises, skipping this quorum, where another
    group gives way to this one. `store`: the quorum's, torchft's."""
    mine = facts_here(replica_id or "0", group_world_size or 1, quorums)
    store.set(f"torch_mojo/replica/{rank}", mine.to_json())
    everyone = [ReplicaFacts.from_json(text) for text in
                store.multi_get([f"torch_mojo/replica/{peer}" for peer in range(world_size)])]
    verdict = judge(mine, everyone)
    if verdict is None:
        return
    if not verdict.refused:
        raise RuntimeError(verdict.message)
    # torchft takes a failed configure as a passing fault and would come
    # back at the next step; torchrun, restarting the group, finds the record.
    _torchrun_record(REFUSED, verdict.message)
    print(verdict.message, file=sys.stderr, flush=True)
    os._exit(1)


def _end_if_refused_before() -> None:
    """A group that torchrun restarted after it was refused ends before it
    joins a quorum (and costs the others nothing)."""
    refused_before = _torchrun_record(REFUSED)
    if refused_before:
        raise RuntimeError(refused_before)


def _torchrun_record(key: str, value: Optional[str] = None) -> Optional[str]:
    """Reads (or, given `value`, writes) `key` in the store of the torchrun
    that runs this process, which outlives its restarts; None where this
    process is not under torchrun or the key is not there."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or "MASTER_PORT" not in os.environ:
        return None
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                     timeout=timedelta(seconds=10))
    if value is not None:
        store.set(key, value)
        return value
    return store.get(key).decode() if store.check([key]) else None


def process_group_through_torchcomms(timeout: timedelta = timedelta(seconds=60), name: str = "torchft"):
    """torchft's ProcessGroupTorchComms over a `mojo` communicator of
    torchcomms made with enable_reconfigure: at each new quorum torchft
    passes the members' init handles to reconfigure(). Made under torchrun,
    whose store (MASTER_ADDR, MASTER_PORT) each handle names: the quorum's
    members, from replica groups that share no store, meet at the one the
    first handle names. A peer that dies or stalls fails the calls in the
    caller (abort_process_on_timeout_or_error=False), for torchft to drop
    it. Needs torchcomms and torch-mojo built with it (make torchcomms-check)."""
    import torchcomms
    from torchft.process_group import create_store_client
    from torchft.torchcomms import ProcessGroupTorchComms

    class AgreeingProcessGroupTorchComms(ProcessGroupTorchComms):
        """torchft's, whose configure() also refuses replica groups that
        disagree, as ProcessGroupMojo does: the facts and the init handles
        go through one client of the quorum's store (a TCPStore client
        costs a connection, and c10d looks up the peer's name on each)."""
        _quorums = 0

        def configure(self, store_addr, replica_id, rank, world_size, quorum_id=None, group_rank=None,
                      group_world_size=None, global_ranks=None):
            store = create_store_client(store_addr, timeout=self._timeout)
            _require_agreement(store, rank, world_size, replica_id, group_world_size, self._quorums)
            store.set(f"torchcomms_init_handle/{rank}", self._comm.get_init_handle())
            handles = store.multi_get([f"torchcomms_init_handle/{peer}" for peer in range(world_size)])
            self._comm.reconfigure(uuid=quorum_id, init_handles=[handle.decode() for handle in handles],
                                   timeout=self._timeout).wait()
            self._world_size = world_size
            self._quorums += 1

    _end_if_refused_before()
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    comm = torchcomms.new_comm("mojo", current_accelerator() or torch.device("cpu"), name=name, store=store,
                               enable_reconfigure=True, abort_process_on_timeout_or_error=False, timeout=timeout)
    return AgreeingProcessGroupTorchComms(comm, timeout=timeout)


def require_lighthouse(address: Optional[str] = None, timeout: timedelta = timedelta(seconds=30)) -> None:
    """Wait up to `timeout` for torchft's Lighthouse at `address` (default
    TORCHFT_LIGHTHOUSE) to take a connection, and raise where it does not.
    Called on every rank before torchft's Manager: without it only a
    group's first rank, which talks to the Lighthouse, says that it is
    unreachable (after torchft's connect timeout, 60 s), and the others wait
    until torchrun ends them, saying nothing."""
    address = address or os.environ.get("TORCHFT_LIGHTHOUSE")
    if not address:
        raise RuntimeError("TORCHFT_LIGHTHOUSE is not set: set it to the address of torchft's Lighthouse "
                           "(for instance http://host:29510, where torchft_lighthouse runs)")
    parts = urlsplit(address if "://" in address else f"http://{address}")
    if not parts.hostname or not parts.port:
        raise RuntimeError(f"TORCHFT_LIGHTHOUSE is '{address}': give it as http://host:port")
    deadline = time.monotonic() + timeout.total_seconds()
    while True:  # the Lighthouse may be starting at the same moment as the job
        try:
            socket.create_connection((parts.hostname, parts.port), timeout=1).close()
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"torchft's Lighthouse at {address} did not answer within {timeout.total_seconds():g} s "
                    f"({error.strerror or error}): start torchft_lighthouse there first, or set "
                    f"TORCHFT_LIGHTHOUSE to where it runs") from None
            time.sleep(0.2)


@contextmanager
def lighthouse_named_on_timeout(address: Optional[str] = None):
    """Around a training loop: a quorum that timed out (torchft's bare
    "TimeoutError: Timeout expired", after its quorum_timeout) raises the
    error that names the Lighthouse, where the Lighthouse has gone."""
    try:
        yield
    except TimeoutError:
        require_lighthouse(address, timedelta(seconds=1))
        raise


def manager_store(timeout: timedelta = timedelta(seconds=60)) -> tuple[str, int, Optional[TCPStore]]:
    """(host, port, server) of a store that this torchrun attempt's ranks
    alone share, for torchft's Manager (store_addr=host, store_port=port;
    keep `server`, the store itself on rank 0, for as long as the Manager).
    Called by every rank of the replica group after init_process_group.

    torchft 0.2.0's Manager finds its server under a fixed key of the store
    it is given (by default MASTER_ADDR's, torchrun's), and torchrun keeps
    that store across the restarts of a group: a restarted group's other
    ranks can read the server address of the attempt before, fail to
    connect for 60 s, and take the whole group down again."""
    server = None
    address = [None]
    if dist.get_rank() == 0:
        server = TCPStore(socket.gethostname(), 0, is_master=True, wait_for_workers=False, timeout=timeout)
        address = [(socket.gethostname(), server.port)]
    dist.broadcast_object_list(address, src=0)
    host, port = address[0]
    return host, port, server


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
