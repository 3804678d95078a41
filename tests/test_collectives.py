"""Every collective, dtype and reduce op on 1 to 4 real processes."""

import pytest

from tests.harness import run_worker


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_collective_matrix(world_size):
    results = run_worker("collectives", world_size, timeout=240)
    for result in results:
        assert "checked" in result.stdout


@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot"])
def test_each_all_reduce_algorithm(algorithm):
    # auto picks one_shot below 64 KiB and for 2 ranks: force each on 3.
    run_worker("collectives", 3, "--quick", env={"MOJOCCL_ALGO": algorithm}, timeout=180)
