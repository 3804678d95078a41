"""Faults survived (TORCH_MOJO_BACKEND_PG_WATCHDOG=raise): a failed
collective raises in its caller, torch_mojo.distributed.failed_ranks names
the ranks that died, and dist.shrink_group makes a working group of the
survivors, within a node and across simulated nodes, twice in one job."""

import re

import pytest

from tests.harness import run_worker
from tests.test_faults import clean_shm  # noqa: F401 (a fixture)

RAISE = {"TORCH_MOJO_BACKEND_PG_WATCHDOG": "raise", "TORCH_MOJO_BACKEND_TRACE": "0"}
TWO_NODES = {rank: {"MOJOCCL_HOSTID": "ab"[rank // 2]} for rank in range(4)}


@pytest.mark.parametrize("placement", ["2 nodes x 2 ranks"])  # one node: tests/test_drill.py
def test_survivors_shrink_the_group_and_go_on(tmp_path, clean_shm, placement):  # noqa: F811
    across = placement != "one node"
    env = {**RAISE, "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_"),
           **({"MOJOCCL_FABRIC_PROVIDER": "tcp"} if across else {})}
    results = run_worker("survive", 4, "killed", env=env, rank_env=TWO_NODES if across else None,
                         timeout=120, check=False)
    assert [result.returncode for result in results] == [0, 0, -9, -9], [r.stderr[-3000:] for r in results]
    for result in results[:3]:  # the first shrink: rank 3 killed inside an all-reduce
        out = result.stdout
        assert "error: ncclAllReduce failed: " in out and "rank 3 (" in out and ") exited" in out, out
        assert "get_error: ErrorType.REMOTE_ERROR" in out, out
        assert "failed ranks: [3]" in out, out
        assert f"shrunk: rank {result.rank} of 3, sum of global ranks 3," in out, out
        assert "subgroup of the old group destroyed: True" in out, out
        assert "The error is raised in the caller (TORCH_MOJO_BACKEND_PG_WATCHDOG=raise)" in result.stderr
    for result in results[:2]:  # the second: global rank 2, now rank 2 of 3
        out = result.stdout
        assert "new subgroup: 2" in out and "failed ranks: [2]" in out, out
        assert f"shrunk: rank {result.rank} of 2, sum of global ranks 1," in out, out
        assert out.rstrip().endswith("finished"), out
        # From the kill to a working group of the survivors (the goal: 5 s).
        for seconds in re.findall(r"new group ([\d.]+) s after the kill", out):
            assert float(seconds) < 5, out
        assert (tmp_path / f"fr_rank_{result.rank}").exists()


def test_a_stalled_rank_times_out_in_the_caller_and_the_process_goes_on(clean_shm):  # noqa: F811
    waiter, sleeper = run_worker("survive", 2, "stalled", env=RAISE, timeout=60)
    out = waiter.stdout
    # How long past its timeout the watchdog notices varies with the load.
    assert re.search(r"error: \[rank 0\] all_reduce 16 x float32 sum \(collective #2\) Timed out after "
                     r"2\.\d s \(the timeout= of its group is 2\.0 s\)", out), out
    assert "get_error: ErrorType.TIMEOUT" in out and "failed ranks: []" in out, out
    assert out.rstrip().endswith("went on") and "Aborting" not in waiter.stderr, waiter.stderr
    # The late rank completes the collective its peer gave up on (the peer's
    # part was there), and its next call fails: rank 0 is gone.
    out = sleeper.stdout
    assert "completed: 4\nerror: ncclAllReduce failed: rank 1, ncclAllReduce(count=16" in out, out
    assert "rank 0 destroyed or aborted its communicator" in out, out  # it left, by its timeout
    assert "failed ranks: []" in out and out.rstrip().endswith("went on"), out


def test_survivors_that_disagree_on_whom_to_exclude_fail_at_the_bootstrap_timeout(clean_shm):  # noqa: F811
    results = run_worker("survive", 4, "disagree", env={**RAISE, "MOJOCCL_BOOTSTRAP_TIMEOUT_S": "3"},
                         timeout=60)
    outs = [result.stdout for result in results]
    for out in outs[:3]:
        seconds = float(out.split(" s: ")[0])
        assert 3 <= seconds < 10, out
    # Rank 0 and rank 1 each made a group the others never joined; rank 2
    # waited for a group whose first rank never made it.
    assert "did not join the communicator within 3 s (MOJOCCL_BOOTSTRAP_TIMEOUT_S)" in outs[0], outs[0]
    assert "did not join the communicator within 3 s (MOJOCCL_BOOTSTRAP_TIMEOUT_S)" in outs[1], outs[1]
    assert ("the group's first rank did not publish its communicator in the store within 3 s "
            "(MOJOCCL_BOOTSTRAP_TIMEOUT_S)") in outs[2], outs[2]
