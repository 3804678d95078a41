"""The same script under torchrun, mpirun and srun: torch_mojo.launcher sets
torchrun's variables from the launcher's. mpirun is Open MPI's, for real;
there is no SLURM here, so srun's tasks are started with the variables srun
sets."""

import os
import subprocess
import sys

import pytest

from torch_mojo.launcher import first_host, hosts, rendezvous_port, tasks_per_node
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


def a_job_whose_port_is_free() -> int:
    """A job id whose step 0 rendezvous port nothing here uses."""
    import socket

    for job in range(os.getpid(), os.getpid() + 1000):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", rendezvous_port(job, 0)))
                return job
            except OSError:
                continue
    raise AssertionError("no free port in 1,000 job ids")


def test_srun_tasks_run_the_torchrun_script_unchanged(tmp_path):
    # What srun --mpi=pmi2 exports to each task of `srun --ntasks=2 python
    # train_ddp.py` on one node (no RANK, no MASTER_ADDR: torchrun's
    # variables are absent; PMI's are there, and MPI must not be started).
    job = str(a_job_whose_port_is_free())
    tasks = {rank: {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_STEP_ID": "0",
                    "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_JOB_ID": job,
                    "SLURM_JOB_NODELIST": "localhost", "PMI_RANK": str(rank), "PMI_SIZE": "2", "PMI_FD": "99"}
             for rank in range(2)}
    without_torchrun = ["env"] + [f"-u{name}" for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                          "MASTER_ADDR", "MASTER_PORT")]
    no_mpi = SHOW + "; import sys; assert 'mpi4py' not in sys.modules"
    results = run_ranks([*without_torchrun, sys.executable, "-c", no_mpi], 2, rank_env=tasks, timeout=60)
    port = str(rendezvous_port(int(job), 0))
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


def test_slurm_node_lists_and_task_counts_are_read_as_slurm_writes_them():
    assert hosts("nid[0012-0013,0020],login1") == ["nid0012", "nid0013", "nid0020", "login1"]
    assert hosts("n[1-2]") == ["n1", "n2"] and hosts("a1,b2") == ["a1", "b2"]
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1] and tasks_per_node("4") == [4]
    # Two steps of one job, and neighbouring jobs, rendezvous apart.
    assert len({rendezvous_port(job, step) for job in (100, 101) for step in (0, 1)}) == 4


def test_each_node_gets_its_own_local_world_size():
    """`srun -N 2 -n 3`: 2 tasks on n1 and 1 on n2; each is told its own."""
    code = ("import os; from torch_mojo import launcher; launcher.adopt_launcher_environment(rendezvous=False); "
            "print(os.environ['LOCAL_WORLD_SIZE'])")
    seen = []
    for node, rank in (("n1", 0), ("n1", 1), ("n2", 2)):
        env = {name: value for name, value in os.environ.items() if not name.startswith(("SLURM", "LOCAL_", "RANK"))}
        env.update(SLURM_PROCID=str(rank), SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="3", SLURMD_NODENAME=node,
                   SLURM_STEP_TASKS_PER_NODE="2,1", SLURM_STEP_NODELIST="n[1-2]", SLURM_JOB_ID="7")
        seen.append(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                   check=True, timeout=60).stdout.strip())
    assert seen == ["2", "2", "1"]


def test_a_batch_script_of_several_tasks_without_srun_is_told():
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SLURM", "RANK", "PMI"))}
    env.update(SLURM_JOB_ID="42", SLURM_NTASKS="4", SLURM_PROCID="0")
    done = subprocess.run([sys.executable, "-c", "import torch_mojo; torch_mojo.register_mojo_devices()"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert "runs in the batch script of SLURM job 42, which asks for 4 tasks, but srun did not start it: start the " \
           "ranks with `srun python train.py`" in done.stderr
