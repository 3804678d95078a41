"""One rank of one of torchcomms' integration (or hooks') tests, with
`mojo` known to torch.distributed as a user's script has it (some of the
tests call init_process_group with TEST_BACKEND): usage `on_mojo.py
TEST_FILE`.

The file is loaded first and registered after: some of them set variables
before they import torchcomms, which registering would import first. Its
tests then run under unittest, whether or not it has a main guard.

Some tests name the backends that offer a feature (SUPPORTED_BACKENDS) and
expect the others to refuse it: `mojo` joins the lists of the features it
offers, MOJO_OFFERS. ReconfigureTest's setUp puts every backend but gloo
on a CUDA device: `mojo`, a CPU backend here as gloo is, takes gloo's
branch (TEST_DEVICE) and runs the tests as `mojo`."""

import os
import runpy
import sys
import types
import unittest

test_file = sys.argv[1]
module = types.ModuleType("torchcomms_integration_test")
module.__dict__.update(runpy.run_path(test_file, run_name=module.__name__))

import torch_mojo  # noqa: E402

MOJO_OFFERS = {"ReconfigureTest": "reconfigure", "GetInitHandleTest": "getInitHandle",
               "WaitBlockingTest": "wait_blocking"}
for name in MOJO_OFFERS:
    case = getattr(module, name, None)
    if case is not None:
        case.SUPPORTED_BACKENDS = set(case.SUPPORTED_BACKENDS) | {"mojo"}


def on_test_device(case):
    set_up = case.setUp

    def setUp(self):
        os.environ["TEST_BACKEND"] = "gloo"
        try:
            set_up(self)
        finally:
            os.environ["TEST_BACKEND"] = "mojo"
        self.backend = "mojo"

    case.setUp = setUp


if hasattr(module, "ReconfigureTest"):
    on_test_device(module.ReconfigureTest)
torch_mojo.register_mojo_devices()
unittest.main(module=module, argv=[test_file])
