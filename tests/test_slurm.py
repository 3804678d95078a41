"""Jobs under a real Slurm (tests/slurm_site.py: slurmctld and two slurmd,
nodes n1 and n2 with host names of their own): srun with each of its
--mpi plugins, one and two nodes, uneven nodes, two steps of one
allocation at once, the doctor under srun, and the sbatch example as a
user submits it. Each job trains examples/train_ddp.py on mojo and must
print the losses a torchrun job on gloo of the same size prints.
`make slurm-check` (about five minutes), not `make test`."""

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests import slurm_site
from tests.harness import ROOT, run_torchrun_on_gloo
from tests.test_examples import losses

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

HOME = ROOT / ".cache" / "slurm-site"
STEPS = ["--steps", "40"]
# Between the two "nodes": libfabric's tcp on loopback, the provider chosen by
# itself (MOJOCCL_FABRIC_PROVIDER=auto). srun leaves torch its default
# threads (one per core in every rank), torchrun one.
ENVIRONMENT = {"MOJOCCL_SOCKET_IFNAME": "lo",
               "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


@pytest.fixture(scope="module")
def cluster():
    reason = slurm_site.missing()
    if reason:
        pytest.skip(reason)
    HOME.mkdir(parents=True, exist_ok=True)
    for earlier in HOME.glob("run-*"):  # the last run's logs stay until the next
        shutil.rmtree(earlier, ignore_errors=True)
    home = Path(os.path.realpath(HOME)) / f"run-{os.getpid()}"
    home.mkdir()
    started = slurm_site.Cluster(home).start()
    (home / "work").mkdir()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def on_gloo(tmp_path_factory):
    """The losses of torchrun on gloo, by world size."""
    found = {}

    def losses_of(world_size):
        if world_size not in found:
            stdout, _ = run_torchrun_on_gloo([str(ROOT / "examples" / "train_ddp.py"), *STEPS, "--save",
                                              str(tmp_path_factory.mktemp("gloo") / "model.pt")], world_size)
            found[world_size] = losses(stdout)
        return found[world_size]

    return losses_of


def train(cluster, *srun_options, extra=()):
    """srun ... python examples/train_ddp.py, from the cluster's work directory."""
    work = cluster.home / "work"
    command = ["srun", *srun_options, sys.executable, str(ROOT / "examples" / "train_ddp.py"), *STEPS,
               "--save", str(work / "model.pt"), *extra]
    return cluster.run(command, env=ENVIRONMENT, cwd=work, timeout=300)


@pytest.mark.parametrize("mpi", ["none", "pmi2", "pmix"])
def test_srun_with_each_mpi_plugin_trains_across_two_nodes(cluster, on_gloo, mpi):
    done = train(cluster, f"--mpi={mpi}", "-N", "2", "--ntasks-per-node=2")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "backend mojo, world size 4, device cpu" in done.stdout
    assert losses(done.stdout) == on_gloo(4)


def test_srun_on_one_node(cluster, on_gloo):
    done = train(cluster, "-N", "1", "-n", "2")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert losses(done.stdout) == on_gloo(2)


def test_uneven_nodes_each_know_their_own_task_count(cluster, on_gloo):
    """`-N 2 -n 3`: two tasks on n1, one on n2."""
    show = ("import os, socket, torch_mojo; torch_mojo.register_mojo_devices(); "
            "print(socket.gethostname(), os.environ['RANK'], os.environ['LOCAL_WORLD_SIZE'])")
    shown = cluster.run(["srun", "-N", "2", "-n", "3", sys.executable, "-c", show], env=ENVIRONMENT,
                        cwd=cluster.home / "work", timeout=120)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert sorted(shown.stdout.split("\n")[:-1]) == ["n1 0 2", "n1 1 2", "n2 2 1"]
    done = train(cluster, "-N", "2", "-n", "3")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert losses(done.stdout) == on_gloo(3)


def test_two_steps_of_one_allocation_at_once(cluster, on_gloo):
    """Training and a second run side by side: each step its own rendezvous."""
    work = cluster.home / "work"
    step = (f"srun -N 2 -n 2 --exact {sys.executable} {ROOT / 'examples' / 'train_ddp.py'} {' '.join(STEPS)} "
            f"--save {work}/step$1.pt > {work}/step$1.out 2>&1")
    (work / "two-steps.sh").write_text(f"#!/bin/bash\nstep() {{ {step}; }}\nstep 1 &\nstep 2 &\nwait\n")
    done = cluster.run(["sbatch", "--wait", "-N", "2", "-n", "4", f"--output={work}/two-steps-%j.out",
                        str(work / "two-steps.sh")], env=ENVIRONMENT, cwd=work, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    for number in (1, 2):
        output = (work / f"step{number}.out").read_text()
        assert losses(output) == on_gloo(2), output[-3000:]


def test_the_doctor_under_srun(cluster):
    done = cluster.run(["srun", "-N", "2", "--ntasks-per-node=1", sys.executable, "-m", "torch_mojo.doctor",
                        "--json", "--size", "1M"], env=ENVIRONMENT, cwd=cluster.home / "work", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["exit_status"] == 0 and report["all_reduce"]["correct"], report["problems"]
    assert sorted(facts["host"] for facts in report["ranks"]) == ["n1", "n2"]
    assert {facts["launcher"] for facts in report["ranks"]} == {"slurm"}
    assert [link["kind"] for link in report["links"]] == ["between nodes"]


def test_the_sbatch_example_as_a_user_submits_it(cluster, on_gloo):
    """examples/slurm/train_ddp.sbatch unedited: sbatch's options and exports only."""
    work = cluster.home / "work"
    exports = ",".join(["ALL", "NPROC=2", f"TRAIN_ARGS=--steps 40 --save {work}/sbatch.pt"])
    done = cluster.run(["sbatch", "--wait", f"--export={exports}", f"--output={work}/sbatch-%j.out",
                        str(ROOT / "examples" / "slurm" / "train_ddp.sbatch")], env=ENVIRONMENT, cwd=ROOT,
                       timeout=400)
    job = re.search(r"Submitted batch job (\d+)", done.stdout)
    output = (work / f"sbatch-{job.group(1)}.out").read_text() if job else ""
    assert done.returncode == 0, done.stdout + done.stderr + output[-4000:]
    assert "backend mojo, world size 4, device cpu" in output
    assert losses(output) == on_gloo(4)


def test_a_batch_script_that_runs_ranks_without_srun_is_told(cluster):
    work = cluster.home / "work"
    script = work / "no-srun.sh"
    script.write_text(f"#!/bin/bash\n{sys.executable} {ROOT / 'examples' / 'train_ddp.py'} --steps 20\n")
    done = cluster.run(["sbatch", "--wait", "-N", "1", "-n", "2", f"--output={work}/no-srun-%j.out", str(script)],
                       env=ENVIRONMENT, cwd=work, timeout=300)
    job = re.search(r"Submitted batch job (\d+)", done.stdout).group(1)
    output = (work / f"no-srun-{job}.out").read_text()
    assert done.returncode != 0, output  # torch's own error ends it, after ours
    assert (f"runs in the batch script of SLURM job {job}, which asks for 2 tasks, but srun did not start it: "
            "start the ranks with `srun python train.py`") in output, output[-3000:]
