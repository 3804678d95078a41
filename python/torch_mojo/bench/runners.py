"""The runners of `torch-mojo bench`: for one backend, the buffers of a
collective and size, and one call of it (through torch, libmojoccl alone,
its point-to-point, the provider's own swap, or mpi4py)."""

from __future__ import annotations

import contextlib
import os


class Runner:
    """Makes buffers for a collective and size, and runs it once."""

    name = ""

    def __init__(self, world, rank):
        self.world, self.rank = world, rank

    def buffers(self, collective, count):
        import torch

        n = self.world
        send_count = {"all_gather": count // n, "broadcast": count}.get(collective, count)
        recv_count = {"reduce_scatter": count // n}.get(collective, count)
        send = self.allocate(send_count)
        recv = send if collective == "broadcast" else self.allocate(recv_count)
        send.copy_(self.input_values(collective, send_count))
        return send, recv

    def allocate(self, count):
        import torch

        return torch.empty(count, dtype=torch.float32)

    def input_values(self, collective, count):
        """Small integers: every result is exact in float32."""
        import torch

        if collective == "all_to_all":
            return (torch.arange(count, dtype=torch.float32) % 7) + self.rank
        return torch.full((count,), float(self.rank + 1))

    def expected(self, collective, count):
        import torch

        n, rank = self.world, self.rank
        if collective == "all_reduce":
            return torch.full((count,), n * (n + 1) / 2)
        if collective == "broadcast":
            return torch.full((count,), 1.0)
        if collective == "all_gather":
            return torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(count // n)
        if collective == "reduce_scatter":
            return torch.full((count // n,), n * (n + 1) / 2)
        part = count // n  # all_to_all: part r of rank p's input lands at p
        chunks = [(torch.arange(count, dtype=torch.float32) % 7)[rank * part:(rank + 1) * part] + p
                  for p in range(n)]
        return torch.cat(chunks)

    def barrier(self):
        raise NotImplementedError

    def run(self, collective, send, recv):
        raise NotImplementedError


class TorchRunner(Runner):
    def __init__(self, world, rank, name, group, pool=None):
        import torch.distributed as dist

        super().__init__(world, rank)
        self.name, self.group, self.pool = name, group, pool
        # torch 2.13 renamed these two; the old names warn.
        self.all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def allocate(self, count):
        return self.pool.empty(count) if self.pool is not None else super().allocate(count)

    def barrier(self):
        import torch.distributed as dist

        dist.barrier(group=self.group)

    def run(self, collective, send, recv):
        import torch.distributed as dist

        if collective == "all_reduce":
            dist.all_reduce(send, group=self.group)
        elif collective == "all_gather":
            self.all_gather(recv, send, group=self.group)
        elif collective == "reduce_scatter":
            self.reduce_scatter(recv, send, group=self.group)
        elif collective == "broadcast":
            dist.broadcast(send, src=0, group=self.group)
        else:
            dist.all_to_all_single(recv, send, group=self.group)
        return send if collective in ("all_reduce", "broadcast") else recv


class LibraryRunner(Runner):
    def __init__(self, world, rank, gloo_group, pool=None, node=None):
        """`node`: this rank's node (MOJOCCL_HOSTID) in a communicator that
        spans nodes; None: the machine's."""
        import torch.distributed as dist

        from torch_mojo.mojoccl import Library

        super().__init__(world, rank)
        self.name = "mojoccl+pool" if pool is not None else "mojoccl"
        self.pool = pool
        self.library = Library()
        box = [self.library.unique_id() if rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=gloo_group)
        with contextlib.nullcontext() if node is None else _as_node(node):
            self.comm = self.library.init(world, box[0], rank)
        self.token = None

    def allocate(self, count):
        return self.pool.empty(count) if self.pool is not None else super().allocate(count)

    def barrier(self):
        import torch

        if self.token is None:
            self.token = torch.zeros(1)
        self.library.all_reduce(self.comm, self.token, self.token)

    def run(self, collective, send, recv):
        library, comm = self.library, self.comm
        if collective == "all_reduce":
            library.all_reduce(comm, send, send)
            return send
        if collective == "all_gather":
            library.all_gather(comm, send, recv)
        elif collective == "reduce_scatter":
            library.reduce_scatter(comm, send, recv)
        elif collective == "broadcast":
            library.broadcast(comm, send, 0)
            return send
        else:
            library.all_to_all(comm, send, recv, self.world)
        return recv


class PointToPointRunner(LibraryRunner):
    """Whatever the collective: a swap of the whole buffer with the rank
    `ranks_per_node` further on (the next node), both ways at once, with
    libmojoccl's ncclSend and ncclRecv in one group: the wire as the fabric
    transport drives it, without torch in between."""

    def __init__(self, world, rank, gloo_group, ranks_per_node):
        super().__init__(world, rank, gloo_group, node=rank // ranks_per_node)
        self.name = "p2p"
        self.partner = (rank + ranks_per_node) % world
        self.back = (rank - ranks_per_node) % world

    def buffers(self, collective, count):
        send, recv = self.allocate(count), self.allocate(count)
        send.copy_(self.input_values(collective, count))
        return send, recv

    def input_values(self, collective, count):
        import torch

        return torch.full((count,), float(self.rank + 1))

    def expected(self, collective, count):
        import torch

        return torch.full((count,), float(self.back + 1))

    def run(self, collective, send, recv):
        library = self.library
        library.check(library.lib.ncclGroupStart())
        library.send(self.comm, send, self.partner)
        library.recv(self.comm, recv, self.back)
        library.check(library.lib.ncclGroupEnd())
        return recv


class WireRunner(PointToPointRunner):
    """The swap of PointToPointRunner straight on the fabric endpoint."""

    def __init__(self, world, rank, gloo_group, ranks_per_node):
        super().__init__(world, rank, gloo_group, ranks_per_node)
        self.name = "wire"

    def run(self, collective, send, recv):
        self.library.wire_send_recv(self.comm, send, self.partner, recv, self.back)
        return recv


class MpiRunner(Runner):
    name = "mpi"

    def __init__(self, world, rank, comm):
        super().__init__(world, rank)
        self.comm = comm

    def barrier(self):
        self.comm.Barrier()

    def run(self, collective, send, recv):
        from mpi4py import MPI

        a, b = send.numpy(), recv.numpy()
        if collective == "all_reduce":
            self.comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
            return send
        if collective == "all_gather":
            self.comm.Allgather(a, b)
        elif collective == "reduce_scatter":
            self.comm.Reduce_scatter_block(a, b, op=MPI.SUM)
        elif collective == "broadcast":
            self.comm.Bcast(a, root=0)
            return send
        else:
            self.comm.Alltoall(a, b)
        return recv


def group_across_nodes(node):
    """A mojo group over all ranks, this one on node `node`: its
    communicator is made, and reads MOJOCCL_HOSTID, at its first call."""
    import torch
    import torch.distributed as dist

    with _as_node(node):
        group = dist.new_group(backend="mojo")
        dist.all_reduce(torch.ones(1), group=group)
    return group


@contextlib.contextmanager
def _as_node(node):
    """While communicators are made: this rank on node `node` of its own
    (MOJOCCL_HOSTID), the libfabric provider tcp unless one is set."""
    saved = {name: os.environ.get(name) for name in ("MOJOCCL_HOSTID", "MOJOCCL_FABRIC_PROVIDER")}
    os.environ["MOJOCCL_HOSTID"] = f"bench-node-{node}"
    os.environ.setdefault("MOJOCCL_FABRIC_PROVIDER", "tcp")
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
