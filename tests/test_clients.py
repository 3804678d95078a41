"""The clients most people train with, on mojo against gloo (pinned in
requirements-clients.txt): Hugging Face accelerate and the Transformers
Trainer under torchrun, PyTorch Lightning with its own launcher. Each of
examples/clients/ must print the losses its gloo run prints, bit for bit;
the Trainer's resumed run those of the run it resumes. `make clients-check`
(about three minutes), not `make test`."""

import os
import signal
import subprocess
import sys

import pytest

from tests.harness import GLOO_EXIT_ABORT, ROOT, end_hung_job, run_torchrun, run_torchrun_on_gloo

pytestmark = [pytest.mark.clients, pytest.mark.timeout(600)]

CLIENTS = ROOT / "examples" / "clients"
QUIET = {"TORCH_MOJO_BACKEND_TRACE": "0"}
TAKES_GLOO = "accelerate is making the default process group on gloo"


def losses(stdout, prefix="step"):
    return [line for line in stdout.splitlines() if line.startswith(prefix)]


def on_mojo_and_gloo(script):
    mojo, mojo_err = run_torchrun([str(CLIENTS / script)], 2, env=QUIET, timeout=300)
    gloo, _ = run_torchrun_on_gloo([str(CLIENTS / script)], 2, env=QUIET, timeout=300)
    assert losses(mojo) and losses(mojo) == losses(gloo), f"mojo:\n{mojo}\ngloo:\n{gloo}"
    assert TAKES_GLOO not in mojo_err
    return mojo


def test_accelerate_trains_on_mojo_as_on_gloo():
    out = on_mojo_and_gloo("accelerate_train.py")
    assert "backend mojo, 2 ranks, accelerate's distributed type MULTI_CPU" in out, out
    assert "checkpoint saved and loaded" in out


def test_trainer_trains_and_resumes_on_mojo_as_on_gloo():
    out = on_mojo_and_gloo("trainer_train.py")
    assert "backend mojo, 2 ranks" in out, out
    first = {line.split()[1]: line.split()[-1] for line in losses(out)}
    resumed = {line.split()[2]: line.split()[-1] for line in losses(out, "resumed:")}
    assert resumed and all(first[step] == loss for step, loss in resumed.items()), out
    assert float(first["20"]) < float(first["5"]), out  # it learns


def run_lightning(backend):
    """Lightning starts the second rank itself (rank 0, this process, hosts
    the store, and leaves first); gloo's exit abort is run again."""
    for _ in range(5):
        process = subprocess.Popen([sys.executable, str(CLIENTS / "lightning_train.py"), "--backend", backend],
                                   env={**os.environ, **QUIET, "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        try:
            out, err = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            end_hung_job(process.pid)
            out, err = process.communicate()
            raise AssertionError(f"Lightning on {backend} did not end in 300 s:\n{err[-3000:]}")
        if process.returncode == 0:
            return out, err
        if backend != "gloo" or GLOO_EXIT_ABORT not in err:
            break
    raise AssertionError(f"Lightning on {backend} failed:\n{err[-3000:]}")


def test_lightning_trains_on_mojo_as_on_gloo_and_exits_quietly():
    mojo, err = run_lightning("mojo")
    gloo, _ = run_lightning("gloo")
    assert losses(mojo) and losses(mojo) == losses(gloo), f"mojo:\n{mojo}\ngloo:\n{gloo}"
    assert "backend mojo, 2 ranks: done" in mojo
    for noise in ("recvValue failed", "sendBytes failed", "frame #"):
        assert noise not in err, err[-3000:]


def test_accelerate_making_a_gloo_group_is_warned_about(tmp_path):
    script = tmp_path / "accelerate_alone.py"
    script.write_text(
        "import torch, torch_mojo\n"
        "torch_mojo.register_mojo_devices()\n"
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator(cpu=True)\n"
        "import sys; sys.stdout.write(f'rank {accelerator.process_index}: {torch.distributed.get_backend()}\\n')\n"
        "accelerator.end_training()\n")
    out, err = run_torchrun([str(script)], 2, env=QUIET, timeout=300)
    # The words of both ranks' lines, whatever order their writes came in.
    assert sorted(out.split()) == sorted("rank 0: gloo rank 1: gloo".split()), out
    assert err.count(TAKES_GLOO) == 2, err
