"""Faults on real multi-process jobs: a skipped collective, disagreeing
ranks, a killed rank, a rank that raises, a late rank, Ctrl-C. For each:
every surviving rank ends with a clear message in bounded time, exit codes
say who failed, flight-recorder dumps analyse with PyTorch's fr_trace, no
process is left behind and nothing of ours is left in /dev/shm."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.harness import RanksJob, free_port, run_worker, worker_command

TIMEOUT_S = 4


@pytest.fixture
def clean_shm():
    before = set(glob.glob("/dev/shm/mojoccl-*"))
    yield
    assert set(glob.glob("/dev/shm/mojoccl-*")) <= before, "shared memory left behind"


# The two ranks on two simulated nodes: they meet through libfabric.
ON_TWO_NODES = {0: {"MOJOCCL_HOSTID": "a"}, 1: {"MOJOCCL_HOSTID": "b"}}


def run_fault(scenario, tmp_path, *, timeout=60, env=None, rank_env=None):
    env = {"FAULT_TIMEOUT_S": str(TIMEOUT_S), "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_"),
           "TORCH_MOJO_BACKEND_TRACE": "0", **(env or {})}
    if rank_env:
        env["MOJOCCL_FABRIC_PROVIDER"] = "tcp"
    start = time.monotonic()
    results = run_worker("faults", 2, scenario, env=env, rank_env=rank_env, timeout=timeout, check=False)
    return results, time.monotonic() - start


def fr_trace(tmp_path, *options):
    result = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path),
                             "-p", "fr_rank_", *options], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr  # the analyser logs to stderr


def test_a_skipped_collective_is_reported_with_the_rank_that_skipped_it(tmp_path, clean_shm):
    results, seconds = run_fault("skip", tmp_path)
    waiter, skipper = results
    assert waiter.returncode == 1, waiter.stderr
    err = waiter.stderr
    assert ("[rank 0] Watchdog caught collective operation timeout: collective #2 "
            "(all_reduce 1024 x float32 sum) on cpu has not completed") in err, err
    assert "[rank 0]   last collectives issued on cpu, oldest first:" in err
    assert "#1 all_reduce 1024 x float32 sum  completed" in err
    assert "<-- timed out" in err
    assert "not in a collective: rank 1 (its last, #1 all_reduce 1024 x float32 sum, completed)" in err
    assert "look there first" in err
    assert "Aborting the communicators and exiting with status 1" in err
    assert skipper.returncode == 0, skipper.stderr  # it was only slow to join: its own run goes on
    analysis = fr_trace(tmp_path)
    assert "missing ranks: {1}" in analysis and "collective: nccl:all_reduce" in analysis, analysis
    assert seconds < TIMEOUT_S + 30


def test_disagreeing_ranks_all_raise_and_stay_usable(tmp_path, clean_shm):
    results, _ = run_fault("mismatch", tmp_path)
    for result in results:
        assert result.returncode == 0, result.stderr
        out = result.stdout
        assert "count: DistBackendError" in out and "rank 1 called ncclAllReduce(count=8" in out, out
        assert "rank 0 called ncclAllReduce(count=4, float32, sum)" in out, out
        assert "dtype: DistBackendError" in out and "float64" in out, out
        assert "op: DistBackendError" in out and "max" in out, out
        assert "root: DistBackendError" in out and "root=1" in out and "root=0" in out, out
        assert "after the mismatches: 4.0" in out  # 1 + 1, then 2 + 2


@pytest.mark.parametrize("scenario, placement", [
    ("killed", None), ("killed_sender", None), ("exception", None),
    ("killed", ON_TWO_NODES), ("exception", ON_TWO_NODES),
], ids=["killed", "killed_sender", "exception", "killed, 2 nodes", "exception, 2 nodes"])
def test_a_rank_that_dies_is_reported_at_once_not_at_the_timeout(scenario, placement, tmp_path, clean_shm):
    results, seconds = run_fault(scenario, tmp_path, env={"FAULT_TIMEOUT_S": "600"}, rank_env=placement)
    survivor, dead = results
    assert dead.returncode != 0
    assert survivor.returncode == 1, survivor.stderr
    assert "collective #2 (all_reduce 1024 x float32 sum) failed" in survivor.stderr
    # SIGKILL: the process is gone; an exception: Python ends it and the
    # communicator goes with it. Either is named.
    named = ("rank 1 (" in survivor.stderr and "pid" in survivor.stderr and "exited" in survivor.stderr) or \
        "rank 1 destroyed or aborted its communicator" in survivor.stderr
    assert named, survivor.stderr
    # The run ends with the report: the error never reaches the script.
    assert "Desync report" in survivor.stderr and "DistBackendError" not in survivor.stderr
    assert "sent no report" in survivor.stderr
    assert seconds < 40  # the timeout is 600 s: found as it happened
    # A dead rank leaves no dump: the analyser reads what there is.
    analysis = fr_trace(tmp_path, "--allow-incomplete-ranks")
    assert "missed FR dumps from ranks ({1})" in analysis, analysis


def test_a_late_rank_within_the_timeout_succeeds(tmp_path, clean_shm):
    results, _ = run_fault("late", tmp_path)
    for result in results:
        assert result.returncode == 0, result.stderr
        assert "late: completed with 4.0" in result.stdout  # 1 + 1, then 2 + 2


def test_set_timeout_shortens_the_timeout_of_a_live_group(tmp_path, clean_shm):
    results, seconds = run_fault("set_timeout", tmp_path, env={"FAULT_TIMEOUT_S": "600"})
    assert results[0].returncode == 1, results[0].stderr
    assert "(timeout 1.0 s, the timeout= of init_process_group)" in results[0].stderr
    assert seconds < 40


def test_ctrl_c_ends_every_rank(tmp_path, clean_shm):
    job = RanksJob(worker_command("faults", "interrupt"), 2,
                   env={"FAULT_TIMEOUT_S": "600", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_")})
    job.wait_for_output(0, "waiting in collective #2")
    job.wait_for_output(1, "ready")
    time.sleep(0.5)
    start = time.monotonic()
    job.signal(signal.SIGINT)
    results = job.wait(timeout=60, check=False)
    assert time.monotonic() - start < 30
    for result in results:
        assert result.returncode != 0, result.stdout
    assert "KeyboardInterrupt" in results[1].stderr
    assert "[rank 0]" in results[0].stderr, results[0].stderr


def test_sigterm_reports_and_dumps_every_rank_before_it_ends(tmp_path, clean_shm):
    # As at a SLURM time limit: every rank gets SIGTERM, one of them inside
    # a collective the other never issued.
    job = RanksJob(worker_command("faults", "interrupt"), 2,
                   env={"FAULT_TIMEOUT_S": "600", "SLURM_JOB_ID": "4242",
                        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "{job_id}" / "fr_rank_")})
    job.wait_for_output(0, "waiting in collective #2")
    job.wait_for_output(1, "ready")
    time.sleep(0.5)
    start = time.monotonic()
    job.signal(signal.SIGTERM)
    waiter, sleeper = job.wait(timeout=60, check=False)
    assert time.monotonic() - start < 30
    assert waiter.returncode == sleeper.returncode == -signal.SIGTERM, (waiter.stderr, sleeper.stderr)
    headline = "SIGTERM (a time limit, scancel, or the launcher stopping the job): group default_pg: "
    assert f"[rank 0] {headline}#2 all_reduce 1024 x float32 sum, for " in waiter.stderr, waiter.stderr
    assert f"[rank 1] {headline}its last, #1 all_reduce 1024 x float32 sum, completed" in sleeper.stderr
    for result in (waiter, sleeper):
        dump = tmp_path / "4242" / f"fr_rank_{result.rank}"
        assert f"Flight recorder dumped to {dump}" in result.stderr and dump.exists(), result.stderr
    analysis = fr_trace(tmp_path / "4242")
    assert "missing ranks: {1}" in analysis and "collective: nccl:all_reduce" in analysis, analysis


def test_soak_random_collectives_on_four_ranks(clean_shm):
    # 1,500 random operations: all_reduce, reduce, broadcast, all_gather,
    # reduce_scatter, all_to_all; 4 dtypes, 4 reduce ops, sizes 0-200,000,
    # the world and 4 subgroups, half asynchronous; every result checked.
    results = run_worker("soak", 4, "1500", timeout=240)
    for result in results:
        assert ", 0 wrong" in result.stdout, result.stdout


SPAWNED = """
import os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torch_mojo

def rank_main(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # one per core in each rank, as without torchrun
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo", rank=rank, world_size=2)  # rank 0 hosts the store
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    if rank == 1:
        time.sleep(3)  # rank 0 and its store are gone meanwhile: the watchdog polls, the exit announces
    print(f"rank {rank} done, {tensor[0].item():.0f}", flush=True)  # no destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank_main, args=(int(sys.argv[1]),), nprocs=2)
"""


def test_ranks_under_mp_spawn_outlive_the_store_quietly_and_share_the_cores(tmp_path, clean_shm):
    # mp.spawn and Lightning's launcher: rank 0 hosts the store and leaves
    # first, without destroy_process_group(). The others stop using the
    # store, with no word from torch's store client.
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    done = subprocess.run([sys.executable, str(script), str(free_port())], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0 done, 2" in done.stdout and "rank 1 done, 2" in done.stdout
    for noise in ("recvValue failed", "sendBytes failed", "frame #", "Traceback"):
        assert noise not in done.stderr, done.stderr[-3000:]
    # Two ranks of one thread per core: OpenMP's idle threads must not spin
    # on the cores the other rank computes on (openmp_yield.h).
    cpus = len(os.sched_getaffinity(0))
    if cpus >= 2:
        line = f"2 ranks x {cpus} torch threads share {cpus} CPUs: OpenMP's idle threads sleep instead of spinning"
        assert done.stderr.count(line) == 2, done.stderr[-3000:]
