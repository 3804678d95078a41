"""Where the time of one small all-reduce between nodes goes: the same
exchange of SIZE bytes between 2 single-rank "nodes" (MOJOCCL_HOSTID, the
libfabric tcp provider), timed through each layer in one job, the layers
alternating round by round:

  dist.all_reduce              what a training script calls
  backend.allreduce().wait()   the mojo process group's C++ entry, torch's Python layer skipped
  ncclAllReduce                libmojoccl alone (through ctypes)
  mojocclWireSendRecv          the provider's own swap of one message each way on the same endpoint
  MPI_Allreduce, MPI_Sendrecv  Open MPI (mpi4py) on the same TCP

Run under Open MPI with its TCP transport:

    mpirun -np 2 --bind-to none --mca pml ob1 --mca btl self,tcp \\
        .venv/bin/python benchmarks/latency_layers.py [SIZE] [CALLS]

Prints each layer's median per-call time in microseconds: the median over
ROUNDS rounds of each round's median of CALLS calls (and the rounds' spread).
"""

import os
import statistics
import sys
import time

ROUNDS = 5


def main():
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    if world != 2:
        sys.exit("latency_layers.py: run it on 2 ranks (mpirun -np 2)")
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", "29571"), MOJOCCL_HOSTID=f"node{rank}",
                      TORCH_MOJO_BACKEND_TRACE="0")
    os.environ.setdefault("MOJOCCL_FABRIC_PROVIDER", "tcp")

    from mpi4py import MPI
    import numpy as np
    import torch
    import torch.distributed as dist

    import torch_mojo
    from torch_mojo.mojoccl import Library

    torch.set_num_threads(1)
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo")
    mpi = MPI.COMM_WORLD
    library = Library()
    comm = library.init(2, mpi.bcast(library.unique_id() if rank == 0 else None, root=0), rank)

    count = max(1, size // 4)
    tensor, received = torch.ones(count), torch.empty(count)
    array, result = np.ones(count, dtype=np.float32), np.empty(count, dtype=np.float32)
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    options = dist.AllreduceOptions()
    peer = 1 - rank
    layers = {
        "dist.all_reduce": lambda: dist.all_reduce(tensor),
        "backend.allreduce().wait()": lambda: backend.allreduce([tensor], options).wait(),
        "ncclAllReduce": lambda: library.all_reduce(comm, array, result),
        "mojocclWireSendRecv": lambda: library.wire_send_recv(comm, tensor, peer, received, peer),
        "MPI_Allreduce": lambda: mpi.Allreduce(array, result),
        "MPI_Sendrecv": lambda: mpi.Sendrecv(array, peer, recvbuf=result, source=peer),
    }
    medians = {name: [] for name in layers}
    for _ in range(ROUNDS):
        for name, call in layers.items():
            for _ in range(50):  # warm: connections made, caches hot
                call()
            mpi.Barrier()
            times = []
            for _ in range(calls):
                start = time.perf_counter_ns()
                call()
                times.append(time.perf_counter_ns() - start)
            medians[name].append(statistics.median(times) / 1000)
    if rank == 0:
        print(f"# one {size}-byte exchange between 2 nodes, per call: median of {ROUNDS} rounds of {calls} calls (us)")
        for name, values in medians.items():
            print(f"{name:28s} {statistics.median(values):7.1f}   ({min(values):.1f}-{max(values):.1f})")
    library.lib.ncclCommDestroy(comm)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
