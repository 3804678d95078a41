#!/usr/bin/env bash
# The recorded benchmark of docs/performance.md, on one machine.
#   one node: 2 ranks under mpirun (mojo, mojo+pool, gloo, the library alone,
#     MPI), 4 ranks under torchrun (mojo, mojo+pool, gloo), the reduction
#     kernel against memcpy, DDP steps/s;
#   library: libmojoccl alone against Open MPI in one node, 2 and 4 ranks,
#     every collective, 5 rounds alternating (medians by benchmarks/rounds.py);
#   call-cost: what torch-mojo adds to an 8-byte call over torch's own path
#     and the library, the flight recorder on and off (benchmarks/call_cost.py);
#   between nodes ("nodes" of one machine, MOJOCCL_HOSTID, the tcp provider):
#     2 ranks as 2 nodes under mpirun with MPI on TCP (mojo's libfabric path
#     against gloo and MPI over TCP, libmojoccl's point-to-point swap (p2p),
#     the provider's own (wire), and mojo in shared memory), the all-reduce between 2 and 4 single-rank nodes and
#     the cost model's predictions, 2 nodes of 2 ranks on rails and by
#     leaders alone, and DDP across two torchrun agents;
#   threads: train_fsdp2.py and gpt_ddp.py end to end at OMP_NUM_THREADS 1, 2
#     and unset, under torchrun and mp.spawn, mojo against gloo;
#   latency: one small all-reduce between 2 nodes through each layer
#     (dist.all_reduce, the process group, libmojoccl, the provider's own
#     swap) next to Open MPI's, and every other collective through dist.*
#     and libmojoccl next to Open MPI's, at 8 B, 4 KiB and 64 KiB
#     (benchmarks/latency_layers.py);
#   small: every collective from 8 B to 1 MiB between 2 nodes of 1 rank and
#     2 nodes of 2 ranks, dist.* next to Open MPI in each run, the leaders'
#     frames on their sockets and on the fabric (MOJOCCL_NET_FRAMES), and
#     2 nodes of 1 rank under torchrun; 5 rounds alternating; medians and
#     spreads by benchmarks/rounds.py;
#   deterministic: all_reduce and reduce_scatter with MOJOCCL_DETERMINISTIC=1
#     and without, 5 rounds alternating: 2 ranks in one node (mojo) and as 2
#     nodes (mojo+fabric), 2 nodes of 2 ranks;
#   fault-tolerance: torchft's replica groups, step time, recovery from a
#     kill and a new quorum's group, mojo against gloo
#     (benchmarks/fault_tolerance.py);
#   setup: init_process_group and a first all_reduce at 2 to 32 ranks, on
#     one node and as as many simulated nodes, mojo against gloo, libmojoccl's
#     own set-up phase by phase (benchmarks/setup_time.py); the bootstrap
#     rehearsed at 64 to 4,096 ranks in threads, and the model of set-up to
#     10,000 ranks (benchmarks/setup_simulated.py).
# Usage: benchmarks/run.sh [output-dir] [all|one-node|library|call-cost|between-nodes|threads|latency|small|deterministic|fault-tolerance|setup]
#   (default: benchmarks/results, all)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results}
part=${2:-all}
mkdir -p "$out"
bin=.venv/bin
export TORCH_MOJO_BACKEND_TRACE=0 OMP_NUM_THREADS=1
# Open MPI refuses root without these (CI machines run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$bin/python" -c "import mpi4py" 2>/dev/null || "$bin/pip" install --quiet mpi4py matplotlib

one_node() {
  mpirun -np 2 --bind-to none "$bin/python" -m torch_mojo.bench --output "$out/collectives-2ranks" \
    | tee "$out/collectives-2ranks.txt"
  "$bin/torch-mojo" bench --nproc 4 --backends mojo,mojo+pool,gloo --sizes 8,4K,64K,1M,16M,64M \
    --output "$out/collectives-4ranks" | tee "$out/collectives-4ranks.txt"
  "$bin/torch-mojo" bench --nproc 2 --kernels --sizes 256K,4M,64M,256M --output "$out/bench" \
    | tee "$out/kernels-2ranks.txt"
  "$bin/torch-mojo" bench --nproc 2 --ddp --output "$out/bench" | tee "$out/ddp-2ranks.txt"
}

between_nodes() {
  mpirun -np 2 --bind-to none --mca pml ob1 --mca btl self,tcp "$bin/python" -m torch_mojo.bench \
    --backends mojo,mojo+fabric,p2p,wire,gloo,mpi --sizes 8,4K,16K,64K,1M,16M,64M,256M --output "$out/fabric-2ranks" \
    | tee "$out/fabric-2ranks.txt"
  # The same over libfabric 1.17's net provider (TCP without ofi_rxm).
  MOJOCCL_FABRIC_PROVIDER=net mpirun -np 2 --bind-to none --mca pml ob1 --mca btl self,tcp "$bin/python" \
    -m torch_mojo.bench --backends mojo+fabric,wire,mpi --sizes 8,4K,16K,64K,1M,16M,64M,256M \
    --output "$out/fabric-2ranks-net" | tee "$out/fabric-2ranks-net.txt"
  # The all-reduce between 2 and 4 single-rank nodes past the one-message
  # size, and the cost model's predictions up to 1024 nodes next to them.
  for nodes in 2 4; do
    "$bin/torch-mojo" bench --nproc $nodes --backends mojo+fabric,gloo --collectives all_reduce --sizes 256K,1M,16M \
      --output "$out/network-${nodes}nodes" | tee "$out/network-${nodes}nodes.txt"
  done
  "$bin/torch-mojo" bench --model --sizes 256K,1M,16M --measured "$out/network-2nodes.csv,$out/network-4nodes.csv" \
    --output "$out/network" | tee "$out/network-model.txt"
  # 2 nodes of 2 ranks: the all-reduce, all-gather, reduce-scatter and
  # broadcast on rails (each local rank carries its share between nodes)
  # and by the nodes' first ranks alone, next to point-to-point (p2p, wire: every rank
  # swapping with its partner on the other node at once).
  for rails in 1 0; do
    MOJOCCL_NET_RAILS=$rails "$bin/torch-mojo" bench --nproc 4 --ranks-per-node 2 \
      --backends mojo+fabric,p2p,wire,gloo --collectives all_reduce,all_gather,reduce_scatter,broadcast --sizes 256K,1M,16M,64M \
      --output "$out/rails${rails}-2x2" | tee "$out/rails${rails}-2x2.txt"
  done
  # DDP across two torchrun agents, each a "node" of 1, then 2, workers.
  for per_node in 1 2; do
    for node in 1 0; do
      MOJOCCL_HOSTID=node$node MOJOCCL_FABRIC_PROVIDER=tcp "$bin/torchrun" --nnodes=2 --nproc-per-node=$per_node \
        --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29778 --rdzv-id=ddp$per_node -m torch_mojo.bench --ddp \
        --output "$out/ddp-2nodes-x$per_node" > "$out/ddp-2nodes-x$per_node-node$node.txt" &
    done
    wait
    cat "$out"/ddp-2nodes-x$per_node-node?.txt > "$out/ddp-2nodes-x$per_node.txt"  # rank 0 is on either
    rm "$out"/ddp-2nodes-x$per_node-node?.txt
  done
}

# The thread count is what this part varies: each run sets its own.
threads() {
  env -u OMP_NUM_THREADS "$bin/python" benchmarks/threads.py --output "$out" | tee "$out/threads.txt"
}

latency() {
  for size in 8 4096 65536; do
    mpirun -np 2 --bind-to none --mca pml ob1 --mca btl self,tcp "$bin/python" benchmarks/latency_layers.py $size
  done | tee "$out/latency-layers.txt"
}

small() {
  local runs="$out/small-runs"
  mkdir -p "$runs"
  for round in 1 2 3 4 5; do
    for frames in socket fabric; do
      MOJOCCL_NET_FRAMES=$frames mpirun -x MOJOCCL_NET_FRAMES -np 2 --bind-to none --mca pml ob1 --mca btl self,tcp \
        "$bin/python" -m torch_mojo.bench --backends mojo+fabric,mpi --sizes 8,4K,64K,1M \
        --output "$runs/1x1-frames-on-$frames-round$round" > /dev/null
      # 4 ranks on this machine's cores: Open MPI yields as mojo does.
      MOJOCCL_NET_FRAMES=$frames mpirun -x MOJOCCL_NET_FRAMES -np 4 --oversubscribe --bind-to none --mca pml ob1 \
        --mca btl self,tcp "$bin/python" -m torch_mojo.bench --backends mojo+fabric,mpi --ranks-per-node 2 \
        --sizes 8,4K,64K,1M --output "$runs/2x2-frames-on-$frames-round$round" > /dev/null
    done
    # What a user who launches with torchrun gets, against this round's Open MPI.
    "$bin/torchrun" --standalone --nproc-per-node=2 -m torch_mojo.bench --backends mojo+fabric \
      --sizes 8,4K,64K,1M --output "$runs/1x1-torchrun-vs-1x1-frames-on-socket-round$round" > /dev/null
  done
  "$bin/python" benchmarks/rounds.py "$runs"/*.csv | tee "$out/small-messages.txt"
  rm -r "$runs"
}

# What torch-mojo adds to a small call over torch's own path (the `fake`
# backend) and the library, the flight recorder on and off, within a node
# and as 2 nodes (benchmarks/call_cost.py).
call_cost() {
  for nodes in "" --nodes; do
    for recorder in 2000 0; do
      TORCH_FR_BUFFER_SIZE=$recorder "$bin/torchrun" --standalone --nproc-per-node=2 benchmarks/call_cost.py $nodes \
        2> /dev/null
    done
  done | tee "$out/call-cost.txt"
}

# libmojoccl alone against Open MPI within a node, every collective from
# 8 B to 256 MiB at 2 ranks and to 64 MiB at 4 (on this machine's 2 cores),
# 5 rounds alternating; medians and spreads by benchmarks/rounds.py.
library() {
  local runs="$out/library-runs"
  mkdir -p "$runs"
  for round in 1 2 3 4 5; do
    mpirun -np 2 --bind-to none "$bin/python" -m torch_mojo.bench --backends mojoccl,mojoccl+pool,mpi \
      --sizes 8,4K,64K,1M,16M,64M,256M --output "$runs/2-ranks-round$round" > /dev/null
    mpirun -np 4 --oversubscribe --bind-to none "$bin/python" -m torch_mojo.bench --backends mojoccl,mojoccl+pool,mpi \
      --sizes 8,4K,64K,1M,16M,64M --output "$runs/4-ranks-round$round" > /dev/null
  done
  "$bin/python" benchmarks/rounds.py "$runs"/*.csv | tee "$out/library-vs-mpi.txt"
  rm -r "$runs"
}

deterministic() {
  local runs="$out/deterministic-runs"
  mkdir -p "$runs"
  for round in 1 2 3 4 5; do
    for mode in normal deterministic; do
      local flag=$([ $mode = deterministic ] && echo 1 || echo 0)
      MOJOCCL_DETERMINISTIC=$flag mpirun -x MOJOCCL_DETERMINISTIC -np 2 --bind-to none "$bin/python" -m torch_mojo.bench \
        --backends mojo,mojo+fabric --collectives all_reduce,reduce_scatter --sizes 8,4K,64K,1M,16M \
        --output "$runs/$mode-2-ranks-round$round" > /dev/null
      MOJOCCL_DETERMINISTIC=$flag mpirun -x MOJOCCL_DETERMINISTIC -np 4 --oversubscribe --bind-to none \
        "$bin/python" -m torch_mojo.bench --backends mojo+fabric --ranks-per-node 2 \
        --collectives all_reduce,reduce_scatter --sizes 8,4K,64K,1M,16M --output "$runs/$mode-2x2-round$round" > /dev/null
    done
  done
  "$bin/python" benchmarks/rounds.py "$runs"/*.csv | tee "$out/deterministic.txt"
  rm -r "$runs"
}

# torchft's replica groups on mojo against torchft on gloo (needs torchft:
# make torchft-check installs it).
fault_tolerance() {
  "$bin/python" benchmarks/fault_tolerance.py --rounds 3 --output "$out/fault-tolerance.txt"
}

# Set-up time as ranks grow, each rank's imports excluded.
setup() {
  "$bin/python" benchmarks/setup_time.py --rounds 3 --output "$out/setup-one-node.txt"
  "$bin/python" benchmarks/setup_time.py --rounds 3 --per-node 1 --output "$out/setup-nodes.txt"
  "$bin/python" benchmarks/setup_simulated.py --rounds 3 --nodes-file "$out/setup-nodes.txt" \
    --output "$out/setup-simulated.txt"
}

case "$part" in
  all) one_node; library; call_cost; between_nodes; threads; latency; small; deterministic; fault_tolerance; setup ;;
  one-node) one_node ;;
  library) library ;;
  call-cost) call_cost ;;
  between-nodes) between_nodes ;;
  threads) threads ;;
  latency) latency ;;
  small) small ;;
  deterministic) deterministic ;;
  fault-tolerance) fault_tolerance ;;
  setup) setup ;;
  *) echo "benchmarks/run.sh: the part is all, one-node, library, call-cost, between-nodes, threads, latency, small, deterministic," \
       "fault-tolerance or setup, not '$part'" >&2; exit 2 ;;
esac
