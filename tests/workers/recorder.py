"""One rank of a flight-recorder scenario. Usage: recorder.py SCENARIO

  api      _dump_nccl_trace()/_json() return this backend's record while a
           mojo group lives and PyTorch's own after; the debug pipe dumps
  at_exit  rank 0 ends its script with an all_reduce rank 1 never joins
"""

import json
import os
import pickle
import sys
import time

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

import torch_mojo


def main():
    scenario = sys.argv[1]
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo")
    rank = dist.get_rank()
    if scenario == "api":
        dist.all_reduce(torch.ones(16))
        dist.broadcast(torch.ones(3, 4), src=1)
        if rank == 0:
            dist.send(torch.ones(5), 1)
        else:
            dist.recv(torch.empty(5), 0)
        dump = pickle.loads(c10d._dump_nccl_trace())
        names = [entry["profiling_name"] for entry in dump["entries"]]
        states = {entry["state"] for entry in dump["entries"]}
        print(f"pickle: version {dump['version']} names {names} states {sorted(states)}")
        print(f"pickle: ranks {dump['pg_config']}")
        print(f"pickle: stack {dump['entries'][0]['frames'][-1]['name']}")
        entries = json.loads(c10d._dump_nccl_trace_json())["entries"]
        print(f"json: {len(entries)} entries, first {entries[0]['profiling_name']}")
        pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + f"{rank}.pipe"
        with open(pipe, "w") as writer:
            writer.write("dump\n")
        path = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank)
        deadline = time.monotonic() + 10
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(path, "rb") as file:
            print(f"pipe: {len(pickle.load(file)['entries'])} entries in {os.path.basename(path)}")
        dist.destroy_process_group()
        after = pickle.loads(c10d._dump_nccl_trace())
        print(f"after destroy: {len(after.get('entries', []))} entries")
    elif scenario == "at_exit":
        if rank == 0:
            dist.all_reduce(torch.ones(8), async_op=True)
            print("ending the script", flush=True)
        else:
            time.sleep(6)


if __name__ == "__main__":
    main()
