"""Data-parallel training that survives a lost replica group, with torchft
on `mojo` (or on gloo, to compare): torchft's Lighthouse forms a quorum of
the replica groups at every step, a group that dies drops out while the
others go on, and when torchrun restarts it, it rejoins and receives the
healthy groups' weights.

    torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 1000 &
    export TORCHFT_LIGHTHOUSE=http://localhost:29510
    REPLICA_GROUP_ID=0 torchrun --nproc-per-node 1 --max-restarts 3 --master-port 29600 \\
        examples/torchft/train_ddp.py --backend mojo --steps 50 &
    REPLICA_GROUP_ID=1 torchrun --nproc-per-node 1 --max-restarts 3 --master-port 29700 \\
        examples/torchft/train_ddp.py --backend mojo --steps 50

Each committed step prints `replica R step S loss L participants P time T`
(T: the clock's seconds since 1970, to line up with other logs); the end prints a
digest of the weights, the same in every group. The data are generated
(the same batches for a step whichever group trains it), so a run needs
nothing to download.
"""

import argparse
import hashlib
import os
import time
from datetime import timedelta

import torch
from torch import nn, optim
from torchft import Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing.pg_transport import PGTransport

from torch_mojo.torchft import (DistributedDataParallel, ProcessGroupMojo, lighthouse_named_on_timeout,
                                process_group_through_torchcomms, require_lighthouse)


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["mojo", "mojo-torchcomms", "gloo"], default="mojo",
                        help="mojo-torchcomms: torchft's ProcessGroupTorchComms, reconfigured at each quorum")
    parser.add_argument("--steps", type=int, default=50, help="committed steps to train")
    parser.add_argument("--width", type=int, default=256, help="hidden units: the gradient's size")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds of extra work per step")
    parser.add_argument("--timeout", type=float, default=10.0, help="the process group's timeout, seconds")
    parser.add_argument("--heal-over", choices=["http", "group"], default="http",
                        help="how a healing group gets the weights: torchft's HTTP server (its default), "
                             "or the process group itself (torchft's PGTransport)")
    parser.add_argument("--quorum-timeout", type=float, default=60.0,
                        help="seconds to wait for a quorum (past the Lighthouse's --join_timeout_ms)")
    return parser.parse_args()


def batch(step: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(32, width, generator=generator)
    return inputs, (inputs.sum(dim=1) > 0).long()


def digest(tensors: dict) -> str:
    """16 hex digits of the tensors' bytes, in the order of their names."""
    return hashlib.sha256(b"".join(tensors[name].detach().numpy().tobytes() for name in sorted(tensors))).hexdigest()[:16]


def main():
    args = parse()
    replica = int(os.environ.get("REPLICA_GROUP_ID", 0))
    torch.manual_seed(replica)  # each group starts from other weights: healing makes them one
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 2))
    optimizer = optim.SGD(model.parameters(), lr=0.05)
    timeout = timedelta(seconds=args.timeout)
    require_lighthouse(timeout=timeout)  # on every rank: torchft's Manager tells the first alone
    group = {"mojo": ProcessGroupMojo, "mojo-torchcomms": process_group_through_torchcomms,
             "gloo": ProcessGroupGloo}[args.backend](timeout=timeout)

    manager = Manager(
        pg=group,
        min_replica_size=1,
        load_state_dict=lambda state: (model.load_state_dict(state["model"]),
                                       optimizer.load_state_dict(state["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": optimizer.state_dict()},
        replica_id=f"train_ddp_{replica}",
        timeout=timeout,
        quorum_timeout=timedelta(seconds=args.quorum_timeout),
        checkpoint_transport=PGTransport(group, timeout, torch.device("cpu")) if args.heal_over == "group" else None,
    )
    ddp = DistributedDataParallel(manager, model)
    wrapped = Optimizer(manager, optimizer)
    loss_function = nn.CrossEntropyLoss()
    with lighthouse_named_on_timeout():  # a Lighthouse gone mid-run
        while manager.current_step() < args.steps:
            step = manager.current_step()
            wrapped.zero_grad()  # starts the quorum of this step
            inputs, labels = batch(step, args.width)
            loss = loss_function(ddp(inputs), labels)
            loss.backward()  # the gradients' all-reduce across the quorum
            time.sleep(args.step_delay)
            if manager.should_commit():  # False where the quorum lost a group this step
                optimizer.step()
                print(f"replica {replica} step {manager.current_step()} loss {loss.item():.4f} "
                      f"participants {manager.num_participants()} time {time.time():.3f}", flush=True)
    print(f"replica {replica} done step {manager.current_step()} weights {digest(model.state_dict())}", flush=True)
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
