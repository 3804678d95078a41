"""The conformance matrix: every call, dtype, reduce op and root on 1 to 4
real processes, each result checked against an independent computation and
against gloo where gloo supports the case."""

import re

import pytest

from tests.harness import ROOT, run_worker


def documented_calls():
    """The torch.distributed calls in the support table of docs/collectives.md."""
    table = (ROOT / "docs" / "collectives.md").read_text().split("## Calls", 1)[1].split("\n## ", 1)[0]
    calls = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            calls.update(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return calls


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_conformance_matrix(world_size):
    results = run_worker("collectives", world_size, timeout=300)
    for result in results:
        assert "checked" in result.stdout
    if world_size == 4:
        exercised = set(results[0].stdout.split("exercised: ", 1)[1].split())
        missing = documented_calls() - exercised
        assert not missing, f"docs/collectives.md lists calls the matrix does not run: {missing}"


def test_conformance_matrix_staged_only():
    # As root, ranks may always read each other's memory: force the staged
    # algorithms that other machines fall back to.
    run_worker("collectives", 3, env={"MOJOCCL_ZERO_COPY": "0"}, timeout=300)


@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot"])
def test_each_all_reduce_algorithm(algorithm):
    # auto picks one_shot below 64 KiB and for 2 ranks: force each on 3.
    run_worker("collectives", 3, "--quick", env={"MOJOCCL_ALGO": algorithm}, timeout=180)
