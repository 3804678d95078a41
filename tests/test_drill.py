"""The fault drill: {SIGKILL, SIGTERM, an uncaught exception, SIGSTOP past
the timeout} x {inside a collective, between collectives, while a group is
created} x {one node, two simulated nodes}, with
TORCH_MOJO_BACKEND_PG_WATCHDOG=raise. Every cell ends as designed: the
survivors get a clear error in bounded time, read who failed, shrink and go
on (the sum over the new group checked); the victim ends as its fault ends
it; no rank dies of a signal it was not sent; nothing is left in /dev/shm.
Four jobs run the 24 cells (tests/workers/drill.py)."""

import re

import pytest

from tests.harness import run_worker
from tests.test_faults import clean_shm  # noqa: F401 (a fixture)
from tests.workers.drill import BOOTSTRAP_TIMEOUT_S, GROUP_TIMEOUT_S, INIT_CELLS, RUNNING_CELLS

EXIT_STATUS = {"kill": -9, "term": -15, "exception": 1, "stop": 0}
# Seconds from the fault to the survivors' error. SIGTERM: the victim ends
# once its flight-recorder dump (with stack traces) is written, which takes
# seconds on a busy machine.
WITHIN_S = {"kill": 3, "term": 25, "exception": 3, "stop": GROUP_TIMEOUT_S + 3}
CLEAR_ERRORS = (") exited", "destroyed or aborted its communicator", "Timed out after")

JOBS = {"running": (10, RUNNING_CELLS), "init": (6, INIT_CELLS)}


def run_drill(job, across, tmp_path):
    ranks, cells = JOBS[job]
    env = {"TORCH_MOJO_BACKEND_PG_WATCHDOG": "raise", "TORCH_MOJO_BACKEND_TRACE": "0",
           "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_")}
    rank_env = None
    if across:  # the first half of the ranks on node a, the others on b
        env["MOJOCCL_FABRIC_PROVIDER"] = "tcp"
        rank_env = {rank: {"MOJOCCL_HOSTID": "ab"[rank * 2 // ranks]} for rank in range(ranks)}
    results = run_worker("drill", ranks, job, env=env, rank_env=rank_env, timeout=240, check=False)
    victims = {victim: kind for victim, (kind, _) in enumerate(cells, start=1)}
    expected = [EXIT_STATUS[victims[rank]] if rank in victims else 0 for rank in range(ranks)]
    assert [result.returncode for result in results] == expected, \
        [(result.rank, result.stdout[-1500:], result.stderr[-1500:]) for result in results]
    return results, victims


def check_victims(results, victims):
    for victim, kind in victims.items():
        result = results[victim]
        if kind == "term":  # a time limit keeps its evidence
            assert "SIGTERM (a time limit, scancel, or the launcher stopping the job)" in result.stderr
            assert "Flight recorder dumped to" in result.stderr, result.stderr
        elif kind == "exception":
            assert f"ValueError: global rank {victim} gives up" in result.stderr, result.stderr
        elif kind == "stop":  # continued after the others went on: its group is gone
            assert "straggler resumed: " in result.stdout, result.stdout


@pytest.mark.parametrize("across", [False, True], ids=["one node", "2 nodes"])
def test_faults_in_and_between_collectives_are_survived(tmp_path, clean_shm, across):  # noqa: F811
    results, victims = run_drill("running", across, tmp_path)
    check_victims(results, victims)
    for survivor in (results[0], results[-1]):
        out = survivor.stdout
        assert out.rstrip().endswith("finished"), out
        for index, (kind, place) in enumerate(RUNNING_CELLS):
            cell = f"cell {kind} {place}"
            error = re.search(rf"^{cell}: error ([\d.]+) s after the fault: (.*)$", out, re.M)
            assert error, (cell, out)
            seconds, message = float(error[1]), error[2]
            assert seconds < WITHIN_S[kind] and any(text in message for text in CLEAR_ERRORS), (cell, out)
            if kind == "stop":
                assert seconds >= GROUP_TIMEOUT_S * 0.9, (cell, out)
            # The victim is always rank 1 of the group (rank 0 survives,
            # the next victim is the lowest rank left); a straggler is alive.
            listed = "[]" if kind == "stop" else "[1]"
            size = 10 - index - 1
            shrunk = re.search(rf"^{cell}: failed ranks (\[.*?\]); new group of (\d+) ranks [\d.]+ s after "
                               rf"the fault, sum (\d+) \(expected (\d+)\)$", out, re.M)
            assert shrunk and shrunk[1] == listed and int(shrunk[2]) == size, (cell, out)
            assert shrunk[3] == shrunk[4], (cell, out)


@pytest.mark.parametrize("across", [False, True], ids=["one node", "2 nodes"])
def test_faults_while_a_group_is_created_name_the_ranks_that_never_came(tmp_path, clean_shm, across):  # noqa: F811
    results, victims = run_drill("init", across, tmp_path)
    check_victims(results, victims)
    never = ", ".join(rf"{victim} \(global rank {victim}, host [^,]+, pid {results[victim].pid}\)"
                      for victim in victims)
    for survivor in (results[0], results[-1]):
        out = survivor.stdout
        failed = re.search(r"^init: new_group failed ([\d.]+) s after the faults: (.*)$", out, re.M)
        assert failed, out
        assert BOOTSTRAP_TIMEOUT_S * 0.9 <= float(failed[1]) < BOOTSTRAP_TIMEOUT_S + 5, out
        assert re.search(rf"the group of 6 ranks was not created; rank\(s\) that never checked in: {never}\.",
                         failed[2]), out
        assert "init: new group of 2 ranks" in out and "sum 5 (expected 5)" in out, out
        assert out.rstrip().endswith("finished"), out
    # The straggler, continued, fails to make the group the others gave up.
    assert "the group of 6 ranks was not created" in results[4].stdout, results[4].stdout
