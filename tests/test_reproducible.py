"""Reproducible reductions (MOJOCCL_DETERMINISTIC=1): every floating-point
sum, average and product of all_reduce, reduce and reduce_scatter equals,
bit for bit, the rank-order one that the worker computes with torch's own
CPU ops from every rank's seeded input, at every layout of ranks on nodes
("nodes" of one machine by MOJOCCL_HOSTID, libfabric's tcp provider
between them); DDP's parameters come out the same bits at 4x1, 2x2, 1x4."""

import pytest

from tests.harness import run_worker
from tests.test_multinode import FABRIC, on_nodes

DETERMINISTIC = {**FABRIC, "MOJOCCL_DETERMINISTIC": "1"}


@pytest.mark.parametrize(
    "hosts, how, env",
    [
        ("aaaa", "env", {}),
        ("aabb", "switch", {"MOJOCCL_NET_ALGO": "ring"}),
        ("aabb", "env", {"MOJOCCL_NET_ALGO": "rabenseifner", "MOJOCCL_NET_RAILS": "0"}),
        ("abcd", "torch", {}),
        ("abab", "env", {}),
        ("aab", "env", {}),
    ],
    ids=["one node of 4", "2x2, ring, set_deterministic()", "2x2 by leaders, rabenseifner",
         "4 nodes of 1, use_deterministic_algorithms", "2 nodes interleaved", "3 ranks on 2 nodes"],
)
def test_sums_are_the_rank_order_ones_at_every_layout(hosts, how, env):
    env = {**FABRIC, **env} if how != "env" else {**DETERMINISTIC, **env}
    for result in run_worker("rank_order", len(hosts), "check", how, env=env, rank_env=on_nodes(*hosts), timeout=300):
        assert "checked, at most 0 differing" in result.stdout, result.stdout[-3000:]


def test_without_it_the_check_sees_the_layouts_order():
    # The same check on 2 nodes of 2 ranks in the default mode: the nodes'
    # partial sums are added after each node's own, and the results differ
    # from the rank-order ones (so the check above can fail).
    results = run_worker("rank_order", 4, "check", env=FABRIC, rank_env=on_nodes(*"aabb"), timeout=300)
    assert all("differ " in result.stdout for result in results)
    assert "float32 sum count 65541" in results[0].stdout


def test_ddp_parameters_are_the_same_bits_at_every_layout():
    def parameters(hosts, env):
        results = run_worker("rank_order", 4, "ddp", env=env, rank_env=on_nodes(*hosts), timeout=300)
        return {result.stdout.strip() for result in results}

    layouts = [parameters(hosts, DETERMINISTIC) for hosts in ("aaaa", "aabb", "abcd")]
    assert len(layouts[0]) == 1 and layouts[0] == layouts[1] == layouts[2], layouts
    # Without it, 2x2 trains to other bits than one node: what the mode is for.
    assert parameters("aabb", FABRIC) != layouts[0]


@pytest.mark.parametrize("hosts", ["aabb", "aaaa"], ids=["2 nodes of 2", "one node"])
def test_a_rank_in_another_call_fails_every_rank(hosts):
    # bfloat16, which takes the rank-order path on one node too; small (the
    # all-gather in the leaders' frames) and large (exchanges rank to rank):
    # every rank raises.
    env = {**DETERMINISTIC, "TORCH_MOJO_BACKEND_PG_WATCHDOG": "raise"}
    for result in run_worker("rank_order", 4, "mismatch", env=env, rank_env=on_nodes(*hosts), timeout=120):
        errors = [line for line in result.stdout.splitlines() if line.startswith("error: ")]
        assert len(errors) == 2 and all("collective mismatch" in line for line in errors), result.stdout


def test_ranks_that_disagree_fail_at_once():
    results = run_worker("rank_order", 2, "check", env=FABRIC, rank_env={0: {"MOJOCCL_DETERMINISTIC": "1"}},
                         timeout=120, check=False)
    for result in results:
        assert result.returncode != 0
        assert "MOJOCCL_DETERMINISTIC is '1' on rank 0 and '0' on rank 1: set it alike on every rank" in \
            result.stderr, result.stderr[-3000:]
