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
