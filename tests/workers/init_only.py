"""Registers the backend, creates the default group, runs one all_reduce."""

import torch
import torch.distributed as dist

import torch_mojo

torch_mojo.register_mojo_devices()
dist.init_process_group()  # no backend named: the default for cpu
tensor = torch.ones(3)
dist.all_reduce(tensor)
print(f"backend {dist.get_backend_config()} sum {tensor.tolist()}")
dist.destroy_process_group()
