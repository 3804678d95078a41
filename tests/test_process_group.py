"""Process-group behaviour beyond the results: asynchrony and timeouts."""

from tests.harness import run_worker


def test_async_op_returns_before_the_collective_completes():
    results = run_worker("behaviour", 2, "async_overlap", timeout=120)
    out = results[0].stdout
    assert "completed at issue: False" in out, out
    assert "completed after wait: True value 2.0" in out, out


def test_a_collective_a_peer_never_joins_raises_after_the_timeout():
    results = run_worker("behaviour", 2, "timeout", timeout=120)
    out, err = results[0].stdout, results[0].stderr
    assert "DistBackendError" in out and "Watchdog caught collective operation timeout" in out, out
    assert "all_reduce 8 x float32 sum" in out, out
    assert "[rank 0] Watchdog caught collective operation timeout" in err  # reported as it happens
    seconds = float(out.splitlines()[-1].split()[1])  # "after N s"
    assert seconds < 30, out  # the timeout is 3 s: bounded, not a hang
