"""The examples, launched with torchrun as a user would, at small sizes.
Most examples check themselves (against gloo or a single-process run) and
fail the job when they drift; these tests read what they print."""

import glob
import os
import re
import subprocess
import sys

import pytest
import torch

from tests.harness import ROOT, run_torchrun, run_torchrun_on_gloo

EXAMPLES = ROOT / "examples"


def example(name, nproc, *args, cwd=None, timeout=180):
    stdout, stderr = run_torchrun([str(EXAMPLES / name), *map(str, args)], nproc, cwd=cwd, timeout=timeout)
    return stdout


def losses(stdout):
    """{step: loss} from the lines `step N  loss L`."""
    return {int(line.split()[1]): float(line.split()[-1]) for line in stdout.splitlines() if line.startswith("step")}


def train_ddp(tmp_path, nproc, backend, steps=40):
    save = str(tmp_path / f"{backend}-{nproc}-{{rank}}.pt")
    args = [str(EXAMPLES / "train_ddp.py"), "--steps", str(steps), "--save", save]
    if backend == "gloo":
        stdout, stderr = run_torchrun_on_gloo(args, nproc, cwd=tmp_path)
    else:
        stdout, stderr = run_torchrun([*args, "--backend", backend], nproc, cwd=tmp_path)
    states = [torch.load(save.format(rank=rank)) for rank in range(nproc)]
    return stdout, stderr, states


# At 4 ranks (2 ranks train in test_ddp_example_default_run_prints_the_loss).
@pytest.mark.parametrize("nproc", [4])
def test_ddp_example_matches_gloo(tmp_path, nproc):
    stdout, stderr, mojo = train_ddp(tmp_path, nproc, "mojo")
    assert f"backend mojo, world size {nproc}" in stdout
    assert "step  40  loss" in stdout
    assert stderr.count("[TRACE] collectives via ") == nproc
    for state in mojo[1:]:  # every rank holds the same model
        for name in state:
            assert torch.equal(state[name], mojo[0][name]), name
    _, _, gloo = train_ddp(tmp_path, nproc, "gloo")
    for name in gloo[0]:
        torch.testing.assert_close(mojo[0][name], gloo[0][name], rtol=1e-5, atol=1e-6)


def test_ddp_example_default_run_prints_the_loss(tmp_path):
    stdout = example("train_ddp.py", 2, cwd=tmp_path)
    steps = losses(stdout)
    assert len(steps) == 5 and steps[100] < steps[20]
    assert (tmp_path / "checkpoint.pt").exists()


@pytest.mark.parametrize("nproc", [4])
def test_ddp_features_match_gloo(nproc):
    stdout = example("ddp_features.py", nproc)
    variants = [line.split("largest")[0].strip() for line in stdout.splitlines() if "from gloo" in line]
    assert variants == ["synced buffers", "local buffers", "find_unused_parameters", "static_graph",
                        "no_sync accumulation", "fp16 comm hook", "bf16 comm hook", "join, uneven inputs",
                        "many buckets"]


def test_fsdp2_example_learns_and_matches_gloo():
    mojo = losses(example("train_fsdp2.py", 2, "--steps", 30, "--log-every", 10))
    assert mojo[30] < 0.5 * mojo[1]
    gloo_stdout, _ = run_torchrun_on_gloo([str(EXAMPLES / "train_fsdp2.py"), "--steps", "30", "--log-every", "10"], 2)
    gloo = losses(gloo_stdout)
    assert mojo == pytest.approx(gloo, rel=1e-4)
    kept = losses(example("train_fsdp2.py", 4, "--steps", 30, "--log-every", 10, "--reshard-after-forward", "false"))
    assert kept == pytest.approx(mojo, rel=1e-2)  # four ranks sum in another order


def test_checkpoint_resumes_at_the_same_and_another_world_size(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    first = example("checkpoint.py", 2, "--save", checkpoint, "--at", 5, "--steps", 10)
    assert f"saved step 5 to {checkpoint} from 2 ranks" in first
    assert (checkpoint / ".metadata").exists()
    same = example("checkpoint.py", 2, "--resume", checkpoint, "--at", 5, "--steps", 10)
    assert "resumed step 5" in same and list(losses(same)) == [6, 7, 8, 9, 10]
    assert losses(same) == losses(first)
    wider = example("checkpoint.py", 4, "--resume", checkpoint, "--at", 5, "--steps", 10)
    assert "on 4 ranks" in wider
    assert losses(wider) == pytest.approx(losses(first), rel=1e-3)


def test_torchrun_restarts_a_killed_worker_from_the_last_checkpoint(tmp_path):
    args = [str(EXAMPLES / "checkpoint.py"), "--every", "5", "--steps", "24"]
    restarted, _ = run_torchrun(["--max-restarts=1", *args, "--dir", str(tmp_path / "restarted"),
                                 "--kill-rank", "1", "--kill-at-step", "12"], 2, cwd=tmp_path)
    assert "attempt 0: starting at step 1 on 2 ranks" in restarted, restarted
    assert "attempt 1: starting at step 11 on 2 ranks" in restarted, restarted
    reference, _ = run_torchrun([*args, "--dir", str(tmp_path / "reference")], 2, cwd=tmp_path)
    assert losses(restarted) == losses(reference) and len(losses(reference)) == 24, (restarted, reference)


def test_tensor_parallel_2d_meshes_match_one_process():
    assert "tp: largest difference" in example("tensor_parallel.py", 2)
    stdout = example("tensor_parallel.py", 4)
    for layout in ("tp", "tp+fsdp", "hsdp"):
        assert f"{layout}: largest difference from one process" in stdout


@pytest.mark.parametrize("nproc", [4])
def test_pipeline_schedules_match_one_process(nproc):
    stdout = example("pipeline.py", nproc)
    for schedule in ("ScheduleGPipe", "Schedule1F1B"):
        assert f"{schedule} {nproc} stages, 4 micro-batches" in stdout


def test_compile_traces_collectives_without_graph_breaks():
    stdout = example("compile.py", 2, timeout=300)
    compiled = [line.split(" compiled")[0].strip() for line in stdout.splitlines() if "0 graph breaks" in line]
    assert compiled == ["functional collectives", "DTensor TP"]


def test_gpt_ddp_example_learns():
    stdout = example("gpt_ddp.py", 2, "--steps", 40, "--eval-every", 20)
    evaluations = [float(line.split("eval")[1].split()[0]) for line in stdout.splitlines() if line.startswith("step")]
    assert len(evaluations) == 2 and evaluations[1] < evaluations[0] < 4.0


@pytest.mark.parametrize("nodes", [2])  # one node: docs/training.md; tests/test_drill.py
def test_fault_tolerant_ddp_finishes_without_its_killed_rank(tmp_path, nodes):
    shm_before = set(glob.glob("/dev/shm/mojoccl-*"))
    save = str(tmp_path / "rank{rank}.pt")
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "fault_tolerant_ddp.py"), "--nodes", str(nodes), "--save", save],
        env={**os.environ, "PYTHONPATH": str(ROOT), "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_"),
             "TORCH_MOJO_BACKEND_TRACE": "0"},
        capture_output=True, text=True, timeout=180)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-4000:]
    assert "worker 3: killed by SIGKILL" in out and out.count(": exit 0") == 3, out
    for rank in range(3):
        assert f"rank {rank}: step 30 failed (" in out and "ranks that failed: [3]" in out, out
        assert f"rank {rank}: now rank {rank} of 3, resuming after step 29" in out, out
    for seconds in re.findall(r"resuming after step \d+, ([\d.]+) s after the error", out):
        assert float(seconds) < 5, out
    steps = losses(out)
    assert sorted(steps) == [10, 20, 30, 40, 50, 60] and steps[60] < steps[20] < steps[10], out
    assert "finished 60 steps on 3 ranks; parameters equal on every rank: True" in out, out
    states = [torch.load(save.format(rank=rank)) for rank in range(3)]
    for name in states[0]:
        assert torch.equal(states[1][name], states[0][name]) and torch.equal(states[2][name], states[0][name])
    assert set(glob.glob("/dev/shm/mojoccl-*")) <= shm_before, "shared memory left behind"


def porting_table():
    """(CUDA form, device-agnostic form, example files) of each row of
    docs/porting.md's table: the first code span of each of the first two
    columns."""
    rows = []
    for line in (ROOT / "docs" / "porting.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            cuda, agnostic = (cell.split("`")[1] for cell in cells[:2])
            rows.append((cuda, agnostic, [name.strip() for name in cells[2].split(",")]))
    return rows


def test_porting_table_matches_the_examples():
    rows = porting_table()
    assert len(rows) >= 8
    sources = {path.name: path.read_text() for path in EXAMPLES.glob("*.py")}
    for cuda, agnostic, files in rows:
        for name in files:
            assert agnostic in sources[name], f"docs/porting.md: {name} does not use `{agnostic}`"
        users = [name for name, text in sources.items() if cuda in text]
        assert not users, f"docs/porting.md: {users} still use `{cuda}`"
    assert not [name for name, text in sources.items() if "torch.cuda" in text or '"cuda' in text]
