"""Where the time of one small all-reduce between nodes goes: the same
exchange of SIZE bytes between 2 single-rank "nodes" (MOJOCCL_HOSTID, the
libfabric tcp provider), timed through each layer in one job, the layers
alternating round by round:

  dist.all_reduce                 what a training script calls
  backend.allreduce(), blocking   the mojo process group's C++ entry as dist.all_reduce calls it
                                  (asyncOp=False: it runs on the caller's thread), torch's Python
                                  layer skipped
  backend.allreduce(), async      the same with asyncOp=True, then wait(): the group's worker thread
  ncclAllReduce                   libmojoccl alone (through ctypes), the frames on the leaders' sockets
  ncclAllReduce, frames on fabric the same with MOJOCCL_NET_FRAMES=fabric
  mojocclWireSendRecv             the provider's own swap of one message each way on the same endpoint
  MPI_Allreduce, MPI_Sendrecv     Open MPI (mpi4py) on the same TCP

and then every other collective three ways, SIZE bytes in all per rank:
through dist.*, through libmojoccl alone (ctypes), and Open MPI's own
(all_gather, reduce_scatter, broadcast from rank 0, all_to_all).

Run under Open MPI with its TCP transport:

    mpirun -np 2 --bind-to none --mca pml ob1 --mca btl self,tcp \\
        .venv/bin/python benchmarks/latency_layers.py [SIZE] [CALLS]

Prints each layer's median per-call time in microseconds: the median over
ROUNDS rounds of each round's median of CALLS calls (and the rounds' spread).
"""

import ctypes
import os
import statistics
import warnings
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
    from torch_mojo.mojoccl import Library, datatype_of

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's new name
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo")
    mpi = MPI.COMM_WORLD
    library = Library()
    comm = library.init(2, mpi.bcast(library.unique_id() if rank == 0 else None, root=0), rank)
    os.environ["MOJOCCL_NET_FRAMES"] = "fabric"
    comm_fabric_frames = library.init(2, mpi.bcast(library.unique_id() if rank == 0 else None, root=0), rank)
    del os.environ["MOJOCCL_NET_FRAMES"]

    count = max(2, size // 4) // 2 * 2  # halves for the all-gather's and reduce-scatter's parts
    tensor, received, half = torch.ones(count), torch.empty(count), torch.ones(count // 2)
    array, result = np.ones(count, dtype=np.float32), np.empty(count, dtype=np.float32)
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    blocking, asynchronous = dist.AllreduceOptions(), dist.AllreduceOptions()
    blocking.asyncOp = False
    peer = 1 - rank
    # Torch tensors into libmojoccl: a NumPy array's `.ctypes` costs about
    # 4 us a call, more than the layers told apart here.
    layers = {
        "dist.all_reduce": lambda: dist.all_reduce(tensor),
        "backend.allreduce(), blocking": lambda: backend.allreduce([tensor], blocking).wait(),
        "backend.allreduce(), async": lambda: backend.allreduce([tensor], asynchronous).wait(),
        "ncclAllReduce": lambda: library.all_reduce(comm, tensor, received),
        "ncclAllReduce, frames on fabric": lambda: library.all_reduce(comm_fabric_frames, tensor, received),
        "mojocclWireSendRecv": lambda: library.wire_send_recv(comm, tensor, peer, received, peer),
        "MPI_Allreduce": lambda: mpi.Allreduce(array, result),
        "MPI_Sendrecv": lambda: mpi.Sendrecv(array, peer, recvbuf=result, source=peer),
    }
    # The all-to-all's counts built once, as the process group passes them.
    parts = (ctypes.c_size_t * 2)(count // 2, count // 2)
    offsets = (ctypes.c_size_t * 2)(0, count // 2)
    float32 = datatype_of(tensor)
    layers.update({
        "dist.all_gather_into_tensor": lambda: dist.all_gather_into_tensor(received, half),
        "ncclAllGather": lambda: library.all_gather(comm, half, received),
        "MPI_Allgather": lambda: mpi.Allgather(array[: count // 2], result),
        "dist.reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(half, tensor),
        "ncclReduceScatter": lambda: library.reduce_scatter(comm, tensor, half),
        "MPI_Reduce_scatter_block": lambda: mpi.Reduce_scatter_block(array, result[: count // 2]),
        "dist.broadcast": lambda: dist.broadcast(tensor, 0),
        "ncclBroadcast": lambda: library.broadcast(comm, tensor, 0),
        "MPI_Bcast": lambda: mpi.Bcast(array, 0),
        "dist.all_to_all_single": lambda: dist.all_to_all_single(received, tensor),
        "ncclAllToAllv": lambda: library.check(library.lib.ncclAllToAllv(
            tensor.data_ptr(), parts, offsets, received.data_ptr(), parts, offsets, float32, comm, None)),
        "MPI_Alltoall": lambda: mpi.Alltoall(array, result),
    })
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
        print(f"# {size} bytes per rank between 2 nodes, per call: median of {ROUNDS} rounds of {calls} calls (us)")
        for name, values in medians.items():
            print(f"{name:32s} {statistics.median(values):7.1f}   ({min(values):.1f}-{max(values):.1f})")
    library.lib.ncclCommDestroy(comm)
    library.lib.ncclCommDestroy(comm_fabric_frames)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
