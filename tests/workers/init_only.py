"""Registers the backend, creates the default group, runs one all_reduce.
SET_AFTER_IMPORT=NAME=VALUE sets a variable after torch_mojo's import
checked the environment, before the group is made."""

import os

import torch
import torch.distributed as dist

import torch_mojo

torch_mojo.register_mojo_devices()
if os.environ.get("SET_AFTER_IMPORT"):
    name, value = os.environ["SET_AFTER_IMPORT"].split("=", 1)
    os.environ[name] = value
dist.init_process_group()  # no backend named: the default for cpu
tensor = torch.ones(3)
dist.all_reduce(tensor)
print(f"backend {dist.get_backend_config()} sum {tensor.tolist()}")
dist.destroy_process_group()
