"""A subset of PyTorch's own distributed tests on mojo (the whole suite is
`make pytorch-suite`): one test for each fix made for it, and a sample."""

import subprocess
import sys

import pytest

from tests.harness import ROOT
from tests.pytorch_suite.run import SUBSET


@pytest.mark.timeout(1200)  # about two minutes here, more on a busy machine
def test_pytorch_distributed_tests_pass_on_mojo():
    result = subprocess.run([sys.executable, "-m", "tests.pytorch_suite.run", "--subset"], cwd=ROOT,
                            capture_output=True, text=True, timeout=1100)
    summary = result.stdout.splitlines()[0] if result.stdout else ""
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-6000:]}"
    assert summary.startswith("on mojo at WORLD_SIZE=2:") and " 0 failed" in summary, result.stdout
    # Each of them runs on the CPU: none may be skipped.
    assert summary.endswith(f"{len(SUBSET)} passed, 0 skipped, 0 failed"), result.stdout
