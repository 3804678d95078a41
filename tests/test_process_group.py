"""Process-group behaviour beyond the results: asynchrony and timeouts."""

from tests.harness import run_worker


def test_async_op_returns_before_the_collective_completes():
    results = run_worker("behaviour", 2, "async_overlap", timeout=120)
    out = results[0].stdout
    assert "completed at issue: False" in out, out
    assert "completed after wait: True value 2.0" in out, out


def test_report_mode_reports_the_timeout_and_keeps_waiting():
    # TORCH_MOJO_BACKEND_PG_WATCHDOG=report: the report, no exit; when the
    # peer finally leaves, that is reported too and the call raises.
    results = run_worker("behaviour", 2, "timeout", env={"TORCH_MOJO_BACKEND_PG_WATCHDOG": "report"},
                         timeout=120)
    out, err = results[0].stdout, results[0].stderr
    assert "[rank 0] Watchdog caught collective operation timeout: collective #1 (all_reduce 8 x float32 sum)" in err
    assert "Aborting" not in err
    assert "collective #1 (all_reduce 8 x float32 sum) failed" in err  # rank 1 left after 8 s
    assert "DistBackendError" in out and "rank 1 destroyed or aborted its communicator" in out, out
    seconds = float(out.splitlines()[-1].split()[1])  # "after N s"
    assert 7 < seconds < 30, out  # waited for rank 1 past the 3 s timeout: reported, not aborted


def test_off_mode_has_no_watchdog():
    results = run_worker("behaviour", 2, "timeout", env={"TORCH_MOJO_BACKEND_PG_WATCHDOG": "off"}, timeout=120)
    out, err = results[0].stdout, results[0].stderr
    assert "Watchdog" not in err and "Desync" not in err
    assert "rank 1 destroyed or aborted its communicator" in out, out


def test_a_barrier_past_its_timeout_raises_in_the_caller_and_the_process_goes_on():
    # As gloo's: PyTorch's own test_barrier_timeout_* expect the error.
    results = run_worker("behaviour", 2, "barrier_timeout", timeout=120)
    out, err = results[0].stdout, results[0].stderr
    assert "barrier: DistBackendError: [rank 0] barrier (collective #1) Timed out after" in out, out
    assert "The group is aborted: destroy it (or shrink it) and make a new one to go on" in out, out
    seconds = float(out.split("after ")[-1].split()[0])
    assert 1.0 <= seconds < 10, out
    assert "then: [rank 0] barrier (collective #1) Timed out" in out, out
    assert "Watchdog caught" not in err, err
    for result in results:
        assert "default group: [2.0, 2.0]" in result.stdout, result.stdout


def test_monitored_barrier_names_the_rank_that_did_not_arrive():
    results = run_worker("behaviour", 3, "monitored_barrier", timeout=120)
    for result in results:
        assert "all passed" in result.stdout, result.stdout
    for rank in (0, 2):
        out = results[rank].stdout
        assert (f"DistBackendError: [rank {rank}] Rank 1 failed to pass monitoredBarrier in 2000 ms"
                in out), out
        assert float(out.split("after ")[-1].split()[0]) < 10, out
