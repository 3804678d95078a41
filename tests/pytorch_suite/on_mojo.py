"""PyTorch's own distributed tests on `mojo`.

torch ships them in the wheel (torch.testing._internal.distributed.
distributed_test); PyTorch runs them for gloo with BACKEND=gloo, WORLD_SIZE
and TEMP_DIR set, one spawned process per rank. This module runs them the
same way, but every process group the tests create for gloo is created on
mojo instead (PYTORCH_SUITE_ON=gloo leaves them on gloo, for comparison).

Not collected by `make test` (its name does not start with test_): run it
through `python -m tests.pytorch_suite.run`.
"""

import os

os.environ.setdefault("BACKEND", "gloo")  # read when distributed_test is imported

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

import torch_mojo

ON = os.environ.get("PYTORCH_SUITE_ON", "mojo")


def _moved(backend):
    return ON if backend == "gloo" else backend


def _wrap(create, backend_position):
    """`create` (init_process_group or new_group) with gloo's groups on ON."""

    def on_chosen_backend(*args, **kwargs):
        if ON == "mojo":
            torch_mojo.register_mojo_devices()
        if "backend" in kwargs:
            kwargs["backend"] = _moved(kwargs["backend"])
        elif len(args) > backend_position:
            args = (*args[:backend_position], _moved(args[backend_position]), *args[backend_position + 1:])
        return create(*args, **kwargs)

    on_chosen_backend.__wrapped__ = create
    return on_chosen_backend


# init_process_group(backend, ...), new_group(ranks, timeout, backend, ...)
dist.init_process_group = _wrap(dist.init_process_group, 0)
dist.new_group = _wrap(dist.new_group, 2)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()
