"""The same script under torchrun, mpirun and srun: torch_mojo.launcher sets
torchrun's variables from the launcher's. mpirun is Open MPI's, for real;
there is no SLURM here, so srun's tasks are started with the variables srun
sets."""

import os
import subprocess
import sys

import pytest

from torch_mojo.launcher import first_host
from tests.harness import ROOT, free_port, run_ranks, run_torchrun
from tests.test_examples import losses

TRAIN = [str(ROOT / "examples" / "train_ddp.py"), "--steps", "40"]
VARIABLES = ("import os, torch_mojo; torch_mojo.register_mojo_devices(); "
             "line = ' '.join(str(os.environ.get(name)) for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
             "'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'))")
SHOW = VARIABLES + "; print(line)"
# mpirun may splice the ranks' output lines together: each rank writes a file.
WRITE = VARIABLES + "; open(f'rank{os.environ[\"RANK\"]}.txt', 'w').write(line)"


def mpirun(nproc, args, cwd, timeout=240):
    if not subprocess.run(["which", "mpirun"], capture_output=True).stdout:
        pytest.skip("Open MPI's mpirun is not installed")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           # Open MPI refuses to run as root without these (CI machines are root).
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    done = subprocess.run(["mpirun", "-np", str(nproc), "--oversubscribe", "--bind-to", "none",
                           sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr[-6000:]
    return done.stdout


def test_mpirun_runs_the_torchrun_script_unchanged(tmp_path):
    stdout = mpirun(4, TRAIN, tmp_path)
    assert "backend mojo, world size 4" in stdout
    under_torchrun, _ = run_torchrun(TRAIN, 4, cwd=tmp_path)
    assert losses(stdout) == losses(under_torchrun)


def test_mpirun_sets_torchruns_variables(tmp_path):
    mpirun(2, ["-c", WRITE], tmp_path)
    ranks = [(tmp_path / f"rank{rank}.txt").read_text().split() for rank in range(2)]
    assert [fields[:4] for fields in ranks] == [["0", "2", "0", "2"], ["1", "2", "1", "2"]]
    assert ranks[0][4:] == ranks[1][4:]  # one rendezvous address, from rank 0 through MPI


def test_srun_tasks_run_the_torchrun_script_unchanged(tmp_path):
    # What srun exports to each task of `srun --ntasks=2 python train_ddp.py`
    # on one node (no RANK, no MASTER_ADDR: torchrun's variables are absent).
    job = str(free_port())  # the port comes from the job id: pick one that is free
    tasks = {rank: {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_STEP_ID": "0",
                    "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_JOB_ID": job,
                    "SLURM_JOB_NODELIST": "localhost"} for rank in range(2)}
    without_torchrun = ["env"] + [f"-u{name}" for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                          "MASTER_ADDR", "MASTER_PORT")]
    results = run_ranks([*without_torchrun, sys.executable, "-c", SHOW], 2, rank_env=tasks, timeout=60)
    port = str(20000 + int(job) % 20000)
    assert [r.stdout.split() for r in results] == [["0", "2", "0", "2", "localhost", port],
                                                   ["1", "2", "1", "2", "localhost", port]]


@pytest.mark.parametrize("nodelist, host", [
    ("nid[0012-0015,0020],login1", "nid0012"),
    ("node7,node8", "node7"),
    ("gpu-a[01-04]", "gpu-a01"),
    ("localhost", "localhost"),
])
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host
