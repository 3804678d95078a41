"""DDP that survives a dead rank: the others shrink the group and finish.

    python examples/fault_tolerant_ddp.py --nproc 4 --kill-rank 3 --kill-at-step 30

starts 4 workers on this machine (or run it as each task of
`srun --kill-on-bad-exit=0`, which starts the workers itself). Worker 3
SIGKILLs itself in the middle of step 30's backward pass, while DDP's
all-reduces are in flight. With TORCH_MOJO_BACKEND_PG_WATCHDOG=raise the
survivors' collective raises instead of ending the process; each survivor
then
  1. asks who failed (torch_mojo.distributed.failed_ranks),
  2. shrinks the default group without them (dist.shrink_group, SHRINK_ABORT),
  3. agrees with the others on the last step every survivor completed and
     restores its in-memory copy of the model and optimizer from then,
  4. rebuilds DDP on the smaller group and trains on. The global batch stays
     48 samples, split among fewer ranks, so the learning rate stays too.
At the end every survivor checks that all hold the same parameters.

Why not torchrun: its agent stops every worker when one fails (it restarts
them with --max-restarts). The workers' store must outlive any of them, so
this launcher hosts it, as torchrun's agent does; under srun, rank 0 hosts
it and must not be the one that dies.

Options (for the tests): --nodes N gives the workers N simulated nodes
(MOJOCCL_HOSTID), --save PATH where each survivor saves its parameters
(PATH contains {rank}).
"""

import argparse
import copy
import os
import signal
import subprocess
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nproc", type=int, default=4, help="workers to start on this machine")
    parser.add_argument("--nodes", type=int, default=1, help="simulated nodes among them")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--kill-rank", type=int, default=3, help="-1: nobody dies")
    parser.add_argument("--kill-at-step", type=int, default=30)
    parser.add_argument("--save", default=None)
    return parser.parse_args()


def say(line):
    sys.stdout.write(line + "\n")  # one write: the workers share the terminal
    sys.stdout.flush()


# ------------------------------------------------------------ the launcher

def launch(args):
    """Starts the workers with torchrun's variables and a store of its own,
    then waits for all of them: one that dies does not stop the others."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    workers = []
    for rank in range(args.nproc):
        env = {
            **os.environ,
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(args.nproc),
            "LOCAL_WORLD_SIZE": str(args.nproc), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
        env.setdefault("TORCH_MOJO_BACKEND_PG_WATCHDOG", "raise")
        if args.nodes > 1:
            env["MOJOCCL_HOSTID"] = f"node{rank * args.nodes // args.nproc}"
            env.setdefault("MOJOCCL_FABRIC_PROVIDER", "tcp")
        workers.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env=env))
    codes = [worker.wait() for worker in workers]
    for rank, code in enumerate(codes):
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        say(f"worker {rank}: {how}")
    survivors_ok = all(code == 0 for rank, code in enumerate(codes) if rank != args.kill_rank)
    return 0 if survivors_ok else 1


# -------------------------------------------------------------- a worker

def train(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import SHRINK_ABORT
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_mojo
    from torch_mojo.distributed import failed_ranks

    os.environ.setdefault("TORCH_MOJO_BACKEND_PG_WATCHDOG", "raise")  # before the backend reads it
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo")
    me = dist.get_rank()  # this worker's first rank: its name in what it prints

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 2))
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    model = DDP(module)
    if me == args.kill_rank:
        # Dies inside the backward pass, while the others wait in the
        # all-reduce of its gradients.
        def die(grad):
            if step == args.kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
            return grad
        module[0].weight.register_hook(die)

    snapshots = {0: (copy.deepcopy(module.state_dict()), copy.deepcopy(optimizer.state_dict()))}
    step = 1
    while step <= args.steps:
        # The step's global batch of 48 is the same whatever the world size;
        # each rank of the group takes its share.
        generator = torch.Generator().manual_seed(step)
        x = torch.randn(48, 32, generator=generator)
        y = (x.sum(dim=1) > 0).long()
        share = 48 // dist.get_world_size()
        mine = slice(dist.get_rank() * share, (dist.get_rank() + 1) * share)
        try:
            loss = torch.nn.functional.cross_entropy(model(x[mine]), y[mine])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
            if step % 10 == 0:
                mean = loss.detach().clone()
                dist.all_reduce(mean, op=dist.ReduceOp.AVG)
                if dist.get_rank() == 0:
                    say(f"step {step:3d}  ({dist.get_world_size()} ranks)  loss {mean.item():.4f}")
        except dist.DistBackendError as error:
            failed_at = time.monotonic()
            lost = failed_ranks()
            say(f"rank {me}: step {step} failed ({str(error).splitlines()[0]}); ranks that "
                f"failed: {lost}")
            dist.shrink_group(lost, shrink_flags=SHRINK_ABORT)
            # A survivor may have finished the step the others failed in: all
            # go back to the last step every one of them completed.
            completed = torch.tensor([step - 1])
            dist.all_reduce(completed, op=dist.ReduceOp.MIN)
            step = int(completed.item())
            module.load_state_dict(snapshots[step][0])
            optimizer.load_state_dict(snapshots[step][1])
            model = DDP(module)  # on the new default group
            say(f"rank {me}: now rank {dist.get_rank()} of {dist.get_world_size()}, resuming after "
                f"step {step}, {time.monotonic() - failed_at:.2f} s after the error")
            step += 1
            continue
        snapshots[step] = (copy.deepcopy(module.state_dict()), copy.deepcopy(optimizer.state_dict()))
        snapshots.pop(step - 2, None)
        step += 1

    flat = torch.cat([parameter.detach().flatten() for parameter in module.parameters()])
    every = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat)
    same = all(torch.equal(other, flat) for other in every)
    if dist.get_rank() == 0:
        say(f"finished {args.steps} steps on {dist.get_world_size()} ranks; parameters equal on "
            f"every rank: {same}; sum {flat.double().sum().item():.6f}")
    if args.save:
        torch.save(module.state_dict(), args.save.format(rank=me))
    dist.destroy_process_group()


def main():
    args = parse_args()
    from torch_mojo import launcher

    launcher.adopt_launcher_environment()  # srun or mpirun: RANK and the rest from theirs
    if "RANK" not in os.environ:
        sys.exit(launch(args))
    train(args)


if __name__ == "__main__":
    main()
