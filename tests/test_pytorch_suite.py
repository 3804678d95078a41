"""A subset of PyTorch's own distributed tests on mojo (the whole suite is
`make pytorch-suite`): every test that once failed here, and a sample."""

import subprocess
import sys

from tests.harness import ROOT


def test_pytorch_distributed_tests_pass_on_mojo():
    result = subprocess.run([sys.executable, "-m", "tests.pytorch_suite.run", "--subset"], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    summary = result.stdout.splitlines()[0] if result.stdout else ""
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-6000:]}"
    assert summary.startswith("on mojo at WORLD_SIZE=2:") and " 0 failed" in summary, result.stdout
    passed = int(summary.split(": ")[1].split()[0])
    assert passed >= 9, result.stdout
