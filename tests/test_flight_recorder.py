"""The flight recorder through PyTorch's own functions and files."""

from tests.harness import run_worker


def test_dump_functions_and_the_debug_pipe(tmp_path):
    env = {"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_"),
           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "pipe_")}
    results = run_worker("recorder", 2, "api", env=env, timeout=120)
    out = results[0].stdout
    assert ("pickle: version 2.10 names ['nccl:all_reduce', 'nccl:broadcast', 'nccl:send 0->1'] "
            "states ['completed']") in out, out
    assert "pickle: ranks {'0': {'name': '0', 'desc': 'default_pg', 'ranks': '[0, 1]'}}" in out, out
    assert "pickle: stack <module>" in out, out  # the Python stack that issued it
    assert "json: 3 entries, first nccl:all_reduce" in out, out
    assert "pipe: 3 entries in fr_rank_0" in out, out
    assert "after destroy: 0 entries" in out, out  # PyTorch's own again
    assert "nccl:recv 1<-0" in results[1].stdout


def test_a_collective_still_running_at_exit_gets_two_seconds_then_is_reported(tmp_path):
    results = run_worker("recorder", 2, "at_exit", env={"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_")},
                         timeout=120, check=False)
    err = results[0].stderr
    assert "ending the script" in results[0].stdout
    assert ("collective #1 (all_reduce 8 x float32 sum) is still running 2 s after the script ended; "
            "it never completed") in err, err
    assert "Flight recorder dumped to" in err
