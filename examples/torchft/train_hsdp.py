"""HSDP that survives a lost replica group, with torchft on `mojo`: within
a replica group FSDP2 shards the model across the group's ranks (a `mojo`
group of init_process_group, under the group's torchrun; --backend gloo
for gloo there and torchft's ProcessGroupGloo across), and torchft
all-reduces each rank's shard of the gradients across the replica groups
(torch_mojo.torchft.ProcessGroupMojo, rebuilt at every quorum change).
A group that loses a rank drops out of the quorum, torchrun restarts it
whole, and each of its ranks is healed with the shard of the same rank in
a healthy group.

    torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 1000 &
    export TORCHFT_LIGHTHOUSE=http://localhost:29510
    REPLICA_GROUP_ID=0 torchrun --nproc-per-node 2 --max-restarts 3 --master-port 29600 \\
        examples/torchft/train_hsdp.py --steps 50 &
    REPLICA_GROUP_ID=1 torchrun --nproc-per-node 2 --max-restarts 3 --master-port 29700 \\
        examples/torchft/train_hsdp.py --steps 50

(or python examples/torchft/replicas.py --nproc-per-group 2 --script
examples/torchft/train_hsdp.py --steps 50). Prints what train_ddp.py
prints, from each group's first rank; at the end every rank prints the
digest of its shard, the same in every group for the same rank.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn, optim
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import init_device_mesh
from torchft import Manager, Optimizer, ProcessGroupGloo

import torch_mojo
from torch_mojo.torchft import ProcessGroupMojo, lighthouse_named_on_timeout, manager_store, require_lighthouse
from train_ddp import batch, digest, parse


def local_shards(sharded: dict) -> dict:
    """This rank's shard of each parameter: what a healing rank is sent by
    the rank of the same number in a healthy group, whose shards match."""
    return {name: parameter.to_local() for name, parameter in sharded.items()}


def load_local_shards(sharded: dict, shards: dict):
    with torch.no_grad():
        for name, parameter in sharded.items():
            parameter.to_local().copy_(shards[name])


def main():
    args = parse()
    replica = int(os.environ.get("REPLICA_GROUP_ID", 0))
    torch_mojo.register_mojo_devices()
    dist.init_process_group(args.backend)  # this replica group's ranks: FSDP2's
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(replica)  # each group starts from other weights: healing makes them one
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 2))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)  # the root: no parameters of its own here
    # The sharded parameters, taken now: torchft reads them from its quorum
    # thread while the forward runs, when the model's own are the gathered ones.
    sharded = dict(model.named_parameters())
    optimizer = optim.SGD(model.parameters(), lr=0.05)
    timeout = timedelta(seconds=args.timeout)
    require_lighthouse(timeout=timeout)
    store_host, store_port, _store = manager_store()  # this attempt's: torchrun's outlives a restart
    manager = Manager(
        store_addr=store_host,
        store_port=store_port,
        pg=ProcessGroupMojo(timeout=timeout) if args.backend == "mojo" else ProcessGroupGloo(timeout=timeout),
        min_replica_size=1,
        load_state_dict=lambda state: load_local_shards(sharded, state["model"]),
        state_dict=lambda: {"model": local_shards(sharded)},
        replica_id=f"train_hsdp_{replica}",
        # should_commit waits for every rank of the group, one of which may
        # be waiting out the process group's timeout on a peer that hangs.
        timeout=2 * timeout,
        quorum_timeout=timedelta(seconds=args.quorum_timeout),
    )
    # After FSDP2's reduce-scatter within the group: the shard's average
    # across the quorum's groups (a failed all-reduce leaves it, and
    # torchft skips the step).
    for layer in (model[0], model[2]):  # each group of FSDP2's calls its own hook
        layer.set_all_reduce_hook(lambda shard: manager.allreduce(shard).wait())
    wrapped = Optimizer(manager, optimizer)
    loss_function = nn.CrossEntropyLoss()
    first = dist.get_rank() == 0
    with lighthouse_named_on_timeout():
        while manager.current_step() < args.steps:
            step = manager.current_step()
            wrapped.zero_grad()
            inputs, labels = batch(step, args.width)
            loss = loss_function(model(inputs), labels)
            loss.backward()
            time.sleep(args.step_delay)
            if manager.should_commit():  # on every rank: the group commits as one
                optimizer.step()
                if first:  # one write, newline included: the group's ranks share torchrun's output
                    print(f"replica {replica} step {manager.current_step()} loss {loss.item():.4f} "
                          f"participants {manager.num_participants()} time {time.time():.3f}\n", end="", flush=True)
    # One write, newline included, here too.
    print(f"replica {replica} rank {dist.get_rank()} done step {manager.current_step()} weights "
          f"{digest(local_shards(sharded))}\n", end="", flush=True)
    manager.shutdown(wait=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
