"""Several nodes on one machine: MOJOCCL_HOSTID splits the ranks into
"nodes", which then talk through libfabric (the `tcp` provider, real
sockets) while ranks of one node share memory. The conformance matrix, a
DDP job started by two torchrun agents, nodes in separate network
namespaces, and the failures between nodes."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from torch_mojo.mojoccl import REMOTE_ERROR, Library
from tests.harness import ROOT, end_hung_job, free_port, run_ranks, run_torchrun, run_worker
from tests.test_examples import losses

FABRIC = {"MOJOCCL_FABRIC_PROVIDER": "tcp"}


def on_nodes(*hosts):
    """rank_env placing rank r on node hosts[r]."""
    return {rank: {"MOJOCCL_HOSTID": host} for rank, host in enumerate(hosts)}


# The long runs between nodes (6 to 8 ranks, or minutes of jitter) are
# `make scale-check`'s, in CI after `make test`.
LONG = pytest.mark.scale


@pytest.mark.parametrize(
    "hosts",
    [("a", "a", "b", "b"), pytest.param(("a", "b", "c", "d", "a", "c"), marks=LONG), ("a", "b")],
    ids=["2 nodes x 2 ranks", "4 nodes of 1-2 ranks, interleaved", "1 rank per node"],
)
def test_conformance_matrix_across_nodes(hosts):
    results = run_worker("collectives", len(hosts), env=FABRIC, rank_env=on_nodes(*hosts), timeout=400)
    for result in results:
        assert "checked" in result.stdout


@pytest.mark.parametrize("direct_nodes, hosts",
                         [("16", ("a", "b")), pytest.param("1", ("a", "b", "b", "c"), marks=LONG)],
                         ids=["directly, 2 nodes", "by Bruck's all-gather, 3 nodes"])
def test_conformance_matrix_with_frames_in_pieces(direct_nodes, hosts):
    # ofi_rxm's eager limit as a site may set it (16 KiB, libfabric's own
    # default): the leaders' frames past it go in several pieces, and the
    # matrix's mismatches of 1 against 4 pieces, 2 against 4, still meet;
    # gathered by Bruck's algorithm, a message of two frames goes in
    # pieces and one node's frames differ in size from the others'. The
    # frames on the fabric (on the leaders' sockets, the default over tcp,
    # they go whole: every other test between nodes).
    env = {**FABRIC, "FI_OFI_RXM_EAGER_LIMIT": "16384", "MOJOCCL_NET_DIRECT_NODES": direct_nodes,
           "MOJOCCL_NET_FRAMES": "fabric"}
    for result in run_worker("collectives", len(hosts), env=env, rank_env=on_nodes(*hosts), timeout=400):
        assert "checked" in result.stdout


@LONG
def test_conformance_matrix_across_eight_nodes():
    results = run_worker("collectives", 8, env=FABRIC, rank_env=on_nodes(*"abcdefgh"), timeout=900)
    for result in results:
        assert "checked" in result.stdout


@LONG
def test_soak_random_collectives_across_eight_nodes():
    # The soak job of test_faults (random collectives on the world and on
    # subgroups, half asynchronous, every result checked), one rank per node;
    # the world's leaders gather their frames by Bruck's all-gather (3
    # steps), subgroups of up to 4 nodes exchange them directly.
    env = {**FABRIC, "MOJOCCL_NET_DIRECT_NODES": "4"}
    results = run_worker("soak", 8, "800", env=env, rank_env=on_nodes(*"abcdefgh"), timeout=400)
    for result in results:
        assert ", 0 wrong" in result.stdout, result.stdout


@LONG
def test_conformance_matrix_over_libfabrics_net_provider():
    # libfabric 1.17's `net`: reliable datagrams over TCP without ofi_rxm
    # (the provider later libfabric calls tcp), its messages in pieces as
    # large as ofi_rxm's over tcp. The whole matrix, 2 nodes x 2 ranks on rails.
    env = {"MOJOCCL_FABRIC_PROVIDER": "net", "MOJOCCL_IB_TRACE": "1"}
    for result in run_worker("collectives", 4, env=env, rank_env=on_nodes("a", "a", "b", "b"), timeout=400):
        assert "checked" in result.stdout
        assert "); between nodes: net on " in result.stderr, result.stderr[-2000:]


def test_conformance_matrix_over_libfabrics_shm_provider():
    run_worker("collectives", 2, "--quick", env={"MOJOCCL_FABRIC_PROVIDER": "shm"},
               rank_env=on_nodes("a", "b"), timeout=120)


@pytest.mark.parametrize("rails", ["0", "1"])
def test_conformance_matrix_through_the_registered_staging_region(rails):
    # MOJOCCL_FABRIC_MR_LOCAL=1 takes the path of providers that need every
    # buffer registered (FI_MR_LOCAL, as verbs) on tcp: ordinary memory goes
    # through the registered staging region, here 1 MiB (16 slots of 64 KiB,
    # so large messages wait for slots), and the results are the same.
    env = {**FABRIC, "MOJOCCL_FABRIC_MR_LOCAL": "1", "MOJOCCL_REGION_MB": "1", "MOJOCCL_IB_TRACE": "1",
           "MOJOCCL_NET_RAILS": rails}
    results = run_worker("collectives", 4, "--quick", env=env, rank_env=on_nodes("a", "a", "b", "b"), timeout=300)
    # Registered at first use, by the ranks that move ordinary memory
    # between nodes: on rails every rank, else the nodes' first ranks.
    carriers = (0, 1, 2, 3) if rails == "1" else (0, 2)
    for result in results:
        assert "checked" in result.stdout
        registered = "registered the 1048576-byte staging region with tcp" in result.stderr
        assert registered == (result.rank in carriers), result.stderr[-3000:]
    for leader in (results[0], results[2]):
        line = next(line for line in leader.stderr.splitlines() if "messages went through" in line)
        staged = int(line.split(": ")[1].split()[0])
        assert staged > 1000 and "registered 1048576-byte staging region" in line, line


@pytest.mark.parametrize("hosts, deterministic", [("ab", "0"), ("ab", "1"), ("aa", "1")],
                         ids=["2 nodes", "2 nodes, MOJOCCL_DETERMINISTIC", "one node, MOJOCCL_DETERMINISTIC"])
def test_a_send_left_pending_across_collectives(hosts, deterministic):
    # Sends are buffered: rank 0's send waits, in the fabric's point-to-point
    # lane or a shared-memory mailbox, while both ranks all-reduce as many
    # elements (with MOJOCCL_DETERMINISTIC=1 partly rank to rank, on the
    # fabric's collective lane). Between nodes it once met the all-reduce's
    # receive (one tag sequence for both), and its first message to rank 1
    # held rank 0 until rank 1 read its endpoint.
    env = {**FABRIC, "MOJOCCL_DETERMINISTIC": deterministic}
    for result in run_worker("behaviour", 2, "pending_send", env=env, rank_env=on_nodes(*hosts), timeout=120):
        assert result.stdout.count(": right") == 4, result.stdout


def test_a_send_outlives_its_sender_within_a_node():
    # Within a node a large message waits in a shared-memory buffer of the
    # sender's. The sender may end before it is read (a sent message is the
    # receiver's, as a socket's last bytes are); the receiver removes it.
    # Two of them wait in buffers the receiver had mapped before (it once
    # dropped one of those when it read the other, then found no such file).
    results = run_worker("behaviour", 2, "send_then_exit", timeout=90)
    assert "sender gone: True" in results[1].stdout, results[1].stdout
    assert results[1].stdout.count(": right") == 3, results[1].stdout
    assert "left in /dev/shm: []" in results[1].stdout, results[1].stdout


def ccl_job(hosts, env, scenario="init", timeout=60):
    return run_worker("ccl", len(hosts), scenario, env=env, rank_env=on_nodes(*hosts), timeout=timeout)


def test_a_process_that_replaces_its_communicator_gets_its_next_endpoint_ready():
    # The first replacement opens its endpoint between nodes itself, and the
    # next one's in the background (fabric_endpoint.h): the third and later
    # take theirs ready.
    for result in ccl_job("aab", {**FABRIC, "MOJOCCL_IB_TRACE": "1"}, "rebuilt"):
        assert "ok round 4" in result.stdout and "ok forked child exited" in result.stdout, \
            result.stdout + result.stderr[-3000:]
        assert result.stderr.count("its endpoint the spare") == 3, result.stderr


def test_trace_names_each_ranks_node_and_provider():
    # No provider set: `auto` finds no cxi, verbs or efa here and takes tcp.
    results = ccl_job("aab", {"MOJOCCL_IB_TRACE": "1"})
    assert all("ok all_reduce" in result.stdout for result in results)
    assert "[mojoccl] rank 0: node 0 of 2 (ranks 0,1, leader 0); between nodes: " in results[0].stderr
    assert "MOJOCCL_FABRIC_PROVIDER=auto)" in results[0].stderr, results[0].stderr
    assert "[mojoccl] rank 2: node 1 of 2 (ranks 2, leader 2)" in results[2].stderr
    if not any(os.listdir(path) for path in ("/sys/class/cxi", "/sys/class/infiniband") if os.path.isdir(path)):
        assert "between nodes: tcp;ofi_rxm on " in results[0].stderr and "WARNING" not in results[0].stderr
        # Over tcp the leaders' frames go on their own sockets (MOJOCCL_NET_FRAMES=auto).
        assert "); frames on the leaders' sockets" in results[0].stderr, results[0].stderr


@pytest.mark.parametrize(
    "env, message",
    [
        ({"MOJOCCL_FABRIC_PROVIDER": "cxi"}, "has no provider 'cxi' offering reliable tagged messages"),
        ({"MOJOCCL_FABRIC_PROVIDER": "nosuch"}, "Providers here: tcp;ofi_rxm"),
        ({**FABRIC, "MOJOCCL_FABRIC_DOMAIN": "nosuch0"},
         "has no domain 'nosuch0' (MOJOCCL_FABRIC_DOMAIN); its domains here: "),
        ({**FABRIC, "MOJOCCL_FABRIC_DOMAIN": "lo,mlx5_9"},
         "has no domain 'mlx5_9' (MOJOCCL_FABRIC_DOMAIN=lo,mlx5_9); its domains here: "),
        ({**FABRIC, "MOJOCCL_NET_RAILS": "yes"}, "MOJOCCL_NET_RAILS=yes is not valid: expected one of 0, 1"),
        ({**FABRIC, "MOJOCCL_LIBFABRIC": "/nonexistent/libfabric.so.1"},
         "libfabric could not be loaded, and it carries collectives between nodes"),
        ({**FABRIC, "MOJOCCL_NET": "verbs"}, "libfabric's verbs provider serves InfiniBand"),
        ({**FABRIC, "MOJOCCL_IB_TIMEOUT_S": "0"},
         "MOJOCCL_IB_TIMEOUT_S=0 is not valid: expected an integer from 1 to 86400"),
        ({**FABRIC, "MOJOCCL_REGION_MB": "lots"},
         "MOJOCCL_REGION_MB=lots is not valid: expected an integer from 0 to 65536"),
        ({**FABRIC, "MOJOCCL_FABRIC_MR_LOCAL": "1", "MOJOCCL_REGION_MB": "0"},
         "MOJOCCL_FABRIC_MR_LOCAL=1 registers every buffer, and MOJOCCL_REGION_MB=0 turns off the registered "
         "staging buffer that ordinary memory goes through: unset MOJOCCL_REGION_MB (256 MiB) or set it"),
        ({**FABRIC, "MOJOCCL_NET_ALGO": "ring,star"},
         "MOJOCCL_NET_ALGO=ring,star is not valid: expected auto, or a comma-separated list of ring, "
         "recursive_doubling, rabenseifner, tree"),
        ({**FABRIC, "MOJOCCL_NET_DIRECT_NODES": "many"},
         "MOJOCCL_NET_DIRECT_NODES=many is not valid: expected an integer from 1 to 1048576"),
    ],
    ids=["provider absent", "unknown provider", "unknown domain", "unknown domain in a list", "bad rails",
         "no libfabric", "verbs", "bad timeout",
         "bad region size", "registration without a region", "unknown algorithm", "bad direct node count"],
)
def test_bad_fabric_settings_fail_every_rank_at_once(env, message):
    # Set on every rank; a failure agreed at set-up reaches all of them.
    start = time.monotonic()
    results = ccl_job("ab", env)
    for result in results:
        assert result.stdout.startswith("error ") and message in result.stdout, result.stdout
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("variable, value, default, hosts", [
    ("MOJOCCL_NET_ALGO", "ring", "auto", "ab"), ("MOJOCCL_NET_RAILS", "0", "1", "ab"),
    ("MOJOCCL_NET_DIRECT_NODES", "4", "16", "ab"), ("MOJOCCL_NET_FRAMES", "fabric", "auto", "ab"),
    ("MOJOCCL_ALGO", "two_shot", "auto", "aa"), ("MOJOCCL_ZERO_COPY", "0", "1", "aa"),
    ("MOJOCCL_DEVICE_PEERS", "1", "0", "aa"),
])
def test_an_algorithm_setting_that_differs_between_ranks_fails_every_rank(variable, value, default, hosts):
    # Ranks that chose different algorithms would not meet: between nodes,
    # or within one (MOJOCCL_ALGO, MOJOCCL_ZERO_COPY, MOJOCCL_DEVICE_PEERS).
    results = run_worker("ccl", 2, "init", env=FABRIC, timeout=60, rank_env={
        0: {"MOJOCCL_HOSTID": hosts[0], variable: value},
        1: {"MOJOCCL_HOSTID": hosts[1]},
    })
    for result in results:
        assert f"{variable} is '{value}' on rank 0 and '{default}' on rank 1: set it alike on every rank" \
            in result.stdout, result.stdout


def test_ranks_on_different_providers_fail_every_rank():
    # One node on tcp, the other on net: they could not reach each other.
    results = run_worker("ccl", 2, "init", timeout=60, rank_env={
        0: {"MOJOCCL_HOSTID": "a", "MOJOCCL_FABRIC_PROVIDER": "net"},
        1: {"MOJOCCL_HOSTID": "b", "MOJOCCL_FABRIC_PROVIDER": "tcp"},
    })
    for result in results:
        assert "The libfabric provider (MOJOCCL_FABRIC_PROVIDER) is 'net' on rank 0 and 'tcp;ofi_rxm' on rank 1: " \
               "set it alike on every rank" in result.stdout, result.stdout


def test_an_eager_size_that_differs_between_ranks_fails_every_rank():
    # Leaders' frames go in pieces and segments are cut by this size.
    results = run_worker("ccl", 2, "init", env=FABRIC, timeout=60, rank_env={
        0: {"MOJOCCL_HOSTID": "a", "FI_OFI_RXM_EAGER_LIMIT": "16384"},
        1: {"MOJOCCL_HOSTID": "b"},
    })
    for result in results:
        assert ("The provider's eager message size (FI_OFI_RXM_EAGER_LIMIT, FI_OFI_RXM_BUFFER_SIZE) is '16128' on "
                "rank 0 and '130816' on rank 1: set it alike on every rank") in result.stdout, result.stdout


@LONG
def test_rails_each_local_rank_on_its_own_domain():
    # Nodes of 2 ranks, interleaved: local rank i of each node carries slice
    # i of a large all-reduce on its own endpoint, here on its own domain of
    # the list (lo for the first, eth0 for the second). The whole matrix:
    # reduce-scatters whose nodes are not rank ranges, reduces and
    # broadcasts run on the rails too.
    domains = ",".join(sorted(_tcp_domains())[:2])
    env = {**FABRIC, "MOJOCCL_FABRIC_DOMAIN": domains, "MOJOCCL_IB_TRACE": "1"}
    results = run_worker("collectives", 4, env=env, rank_env=on_nodes("a", "b", "a", "b"), timeout=400)
    for result in results:
        assert "checked" in result.stdout
        local = result.rank // 2
        domain = domains.split(",")[local % len(domains.split(","))]
        assert f"rail {local} of 2); between nodes: tcp;ofi_rxm on {domain} " in result.stderr, result.stderr[-2000:]


def _tcp_domains():
    from torch_mojo.doctor.facts import describe_fabric
    # An unknown name makes libmojoccl list the domains there are.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MOJOCCL_FABRIC_PROVIDER", "tcp")
        patch.setenv("MOJOCCL_FABRIC_DOMAIN", "none-such")
        _, failure = describe_fabric(0)
    return failure.split("its domains here: ")[1].split(", ")


@pytest.mark.parametrize("algorithm, hosts", [
    ("recursive_doubling", ("a", "a", "b", "b", "c")),
    pytest.param("rabenseifner", ("a", "b", "b", "c", "d", "e"), marks=LONG),
    pytest.param("tree", ("a", "b", "b", "c", "d", "e"), marks=LONG),
    ("tree", ("a", "b", "c", "d")),
], ids=["recursive doubling, 3 nodes", "rabenseifner, 5 nodes", "tree, 5 nodes", "tree, 4 nodes"])
def test_an_algorithm_forced_where_the_node_count_is_not_a_power_of_two(algorithm, hosts):
    # Forced for every size past the one-message frames: the nodes past the
    # largest power of two fold into a partner and get the result back;
    # Rabenseifner's halving and doubling take two steps each among 4. The
    # reduce-scatter takes the ring under recursive doubling and the tree,
    # the halving under rabenseifner: nodes a and b (1 and 2 ranks, uneven
    # parts) act as one. The tree's second tree is the first shifted by one
    # member (5 nodes) or mirrored (4).
    env = {**FABRIC, "MOJOCCL_NET_ALGO": algorithm}
    results = run_worker("collectives", len(hosts), "--quick", env=env, rank_env=on_nodes(*hosts), timeout=300)
    for result in results:
        assert "checked" in result.stdout


@pytest.mark.parametrize("hosts", ["abbcd", "aabbcc"], ids=["4 nodes, by the leaders", "3 nodes of 2, on rails"])
def test_broadcasts_along_the_ring(hosts):
    # MOJOCCL_NET_ALGO=ring: a broadcast past the frames goes along the
    # nodes from the root's, each passing each segment on to the next (on
    # rails, along each rail): 1 MiB and 1,000,001 bytes from every root.
    for result in ccl_job(hosts, {**FABRIC, "MOJOCCL_NET_ALGO": "ring"}, "broadcast", timeout=120):
        assert "ok broadcast" in result.stdout, result.stderr[-3000:]


def test_uneven_all_to_all_across_nodes():
    # Parts past the frames: within each node one collective of its ranks
    # (test_mojoccl's all-to-all), between nodes rank to rank.
    for result in ccl_job("aab", FABRIC, "all_to_all", timeout=120):
        for mode in ("private", "registered", "in place"):
            assert f"ok all_to_all {mode}" in result.stdout, result.stdout + result.stderr[-3000:]


def test_broadcast_takes_the_chain_where_the_model_expects_it_first(monkeypatch):
    # The tree sends the bytes log2(n) times from the root, the chain once
    # from each leader in n - 1 steps (50 us each, 2 GB/s in the model).
    library = Library()
    assert library.predict_broadcast(2, 16 << 20)[0] == "tree"  # one path at 2 nodes: the tie goes to the tree
    assert library.predict_broadcast(3, 128 << 10)[0] == "ring"
    assert library.predict_broadcast(4, 80_000)[0] == "tree"  # 4 nodes: the chain from about 100 KB
    assert library.predict_broadcast(4, 1 << 20)[0] == "ring"
    assert library.predict_broadcast(1024, 1 << 20)[0] == "tree"  # 1023 steps against 10
    assert library.predict_broadcast(1024, 16 << 20)[0] == "ring"
    # MOJOCCL_NET_ALGO, where auto would choose the other way.
    for setting, size, expected in (("tree", 16 << 20, "tree"), ("rabenseifner", 16 << 20, "tree"),
                                    ("ring", 1 << 20, "ring")):
        monkeypatch.setenv("MOJOCCL_NET_ALGO", setting)
        assert library.predict_broadcast(1024, size)[0] == expected, setting


def test_reduce_scatter_on_rails_by_recursive_halving():
    # Rabenseifner's forced: on 2 nodes of 2 consecutive ranks each local
    # rank halves its node sums (one per node) on its rail, where the model
    # would take the ring; the all-reduce's slices go the same way.
    env = {**FABRIC, "MOJOCCL_NET_ALGO": "rabenseifner"}
    results = run_worker("collectives", 4, "--quick", env=env, rank_env=on_nodes("a", "a", "b", "b"), timeout=300)
    for result in results:
        assert "checked" in result.stdout


@pytest.mark.parametrize("rails, scenario, carriers", [
    ("1", "broadcast", (0, 1, 2, 3)), ("0", "broadcast", (0, 2)), ("1", "init", (0, 2)),
], ids=["broadcasts on rails", "broadcasts by the leaders", "a small all-reduce on rails"])
def test_broadcasts_on_rails_carry_a_slice_from_every_local_rank(rails, scenario, carriers):
    # Every buffer registered (MOJOCCL_FABRIC_MR_LOCAL=1): a rank registers
    # the staging region when it first moves bytes between nodes. Broadcasts
    # of 1 MiB from every root, 2 nodes x 2 ranks: on rails each local rank
    # carries its slice; by the leaders, and for a call too small for rails,
    # only the nodes' first ranks move bytes (the frames on the fabric too).
    env = {**FABRIC, "MOJOCCL_FABRIC_MR_LOCAL": "1", "MOJOCCL_REGION_MB": "1", "MOJOCCL_IB_TRACE": "1",
           "MOJOCCL_NET_RAILS": rails, "MOJOCCL_NET_FRAMES": "fabric"}
    for result in ccl_job("aabb", env, scenario, timeout=120):
        assert f"ok {'broadcast' if scenario == 'broadcast' else 'all_reduce'}" in result.stdout, result.stdout
        registered = "registered the 1048576-byte staging region with tcp" in result.stderr
        assert registered == (result.rank in carriers), result.stderr[-3000:]


@LONG
def test_rails_with_ranks_out_of_step():
    # Every rank sleeps a random 0-3 ms before each call, so a rail peer's
    # data often arrives long before the receive: all-gathers,
    # reduce-scatters, all-reduces and broadcasts of 4 MiB blocks (16 MiB
    # buffers) on rails, 2 nodes x 2 ranks, each followed by a barrier of a
    # gloo group, so that no later message of the mojo group delivers one
    # its call left behind. While messages were cut into whole pieces with
    # the rest last (a 4 MiB block: 32 pieces of 130,816 bytes, then 8,192),
    # libfabric 1.17's ofi_rxm over tcp at times left that small last piece
    # undelivered: this job (without broadcasts) stalled in 3 runs of 3 (at
    # call 46 to 94); with the rest first, 0 of 6.
    env = {**FABRIC, "MOJOCCL_IB_TIMEOUT_S": "20"}
    results = run_worker("jittered", 4, "600", env=env, rank_env=on_nodes("a", "a", "b", "b"), timeout=300)
    for result in results:
        assert ", 0 wrong" in result.stdout, result.stdout


def test_the_set_up_says_what_it_took():
    # What benchmarks/setup_simulated.py's model is built from: the exchanges
    # over the bootstrap's tree and their bytes, the phases' times.
    one_node = run_worker("ccl", 2, "init", timeout=60)
    two_nodes = run_worker("ccl", 2, "init", env=FABRIC, timeout=60, rank_env=on_nodes("a", "b"))
    for results, between in ((one_node, "no"), (two_nodes, "yes")):
        for result in results:
            line = next(line for line in result.stdout.splitlines() if line.startswith("setup "))
            rounds, traffic = int(line.split()[2]), int(line.split()[4])
            assert rounds > 0 and traffic > 0 and f"phases 5 between nodes {between}" in line, line
    assert int(two_nodes[0].stdout.split("setup rounds ")[1].split()[0]) > int(
        one_node[0].stdout.split("setup rounds ")[1].split()[0])


def test_a_setting_only_one_rank_has_still_fails_every_rank():
    results = run_worker("ccl", 2, "init", env=FABRIC, timeout=60, rank_env={
        0: {"MOJOCCL_HOSTID": "a"},
        1: {"MOJOCCL_HOSTID": "b", "MOJOCCL_LIBFABRIC": "/nonexistent/libfabric.so.1"},
    })
    for result in results:
        assert "rank 1: libfabric could not be loaded" in result.stdout, result.stdout


def test_ncclmemalloc_regions_are_registered_once_until_freed():
    results = ccl_job("ab", {**FABRIC, "MOJOCCL_IB_TRACE": "1"}, scenario="registered")
    for result in results:
        assert "ok region 1" in result.stdout, result.stdout + result.stderr[-3000:]
        events = [line.split(": ", 1)[1] for line in result.stderr.splitlines() if "ncclMemAlloc region" in line]
        # Three calls on each region: one registration each, released when
        # the region is freed.
        registered = "registered a 400000-byte ncclMemAlloc region with tcp;ofi_rxm"
        freed = "a registered ncclMemAlloc region was freed"
        assert events == [registered, freed, registered, freed], result.stderr[-3000:]


def failed_after(result):
    """How long the call that failed took, from the worker's "error after" line."""
    return float(next(line for line in result.stdout.splitlines() if line.startswith("error after")).split()[2])


def stamp(result, label):
    return float(next(line for line in result.stdout.splitlines() if line.startswith(label)).split()[-1])


def test_a_peer_on_another_node_that_exits_is_named_at_once():
    results = ccl_job("ab", FABRIC, scenario="peer_exits")
    out, err = results[0].stdout, results[0].stderr
    assert f"error {REMOTE_ERROR}" in out, out
    assert f"rank 1 (host {os.uname().nodename}, pid {results[1].pid}) exited" in out, out
    assert failed_after(results[0]) < 5, out  # not MOJOCCL_IB_TIMEOUT_S (60 s)
    # The line in the job's log names the collective and the peer.
    assert "[mojoccl] rank 0, ncclAllReduce(count=1000, float32, sum) (call #1): " in err, err
    assert "the communicator is unusable after an earlier error" in out


def test_a_peer_on_another_node_that_stops_answering_is_named_after_the_timeout():
    # Alive but late (a straggler, or a stopped process): only the timeout tells.
    results = ccl_job("ab", {**FABRIC, "MOJOCCL_IB_TIMEOUT_S": "3", "SLEEP_S": "8"}, scenario="straggler")
    out = results[0].stdout
    assert f"error {REMOTE_ERROR}" in out, out
    assert "waited 3 s for rank 1" in out and "across nodes (MOJOCCL_IB_TIMEOUT_S=3)" in out, out
    assert 2.5 < failed_after(results[0]) < 10, out


@pytest.mark.parametrize(
    "scenario, victim",
    [("dies_in_collective", 2), ("dies_in_send", 3)],
    ids=["a node's first rank", "a rank between sends"],  # another rank: tests/test_drill.py
)
def test_a_killed_rank_on_another_node_fails_every_survivor_within_moments(scenario, victim):
    # 2 nodes x 2 ranks; the victim is SIGKILLed between two calls. Each
    # survivor's failing call names it (rank, host, pid) well before
    # MOJOCCL_IB_TIMEOUT_S (60 s), whichever node it is on.
    results = run_worker("ccl", 4, scenario, env={**FABRIC, "VICTIM": str(victim)},
                         rank_env=on_nodes("a", "a", "b", "b"), timeout=90, check=False)
    assert results[victim].returncode == -9, results[victim]
    for result in results:
        if result.rank == victim:
            continue
        # Within the victim's node a rank may see the death itself (and the
        # host goes without saying) or hear of it from the node's watch.
        pid = results[victim].pid
        names = [f"rank {victim} (host {os.uname().nodename}, pid {pid}) exited"]
        if result.rank // 2 == victim // 2:
            names.append(f"rank {victim} (pid {pid}) exited")
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"error {REMOTE_ERROR}" in result.stdout, result.stdout
        assert any(name in result.stdout for name in names), result.stdout
        # From the kill to this rank's error (one clock: one machine).
        latency = stamp(result, "failed at") - stamp(results[victim], "killed at")
        assert latency < 3, result.stdout


def test_ranks_that_leave_normally_are_not_reported_as_failed():
    results = ccl_job("aabb", FABRIC, scenario="node_leaves_early")
    assert "ok the last messages of a rank that left" in results[0].stdout, results[0].stdout + results[0].stderr[-3000:]
    for result in results[:2]:
        assert "ok after the node left" in result.stdout, result.stdout + result.stderr[-3000:]


def torchrun_agents(nodes, script_args, env, timeout=240):
    """One torchrun agent per "node" (its own MOJOCCL_HOSTID), meeting through
    the c10d rendezvous as agents on separate hosts do."""
    port = free_port()
    agents = []
    for node in range(nodes):
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", "--nproc-per-node=2",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=multinode-test",
                   *script_args]
        agents.append(subprocess.Popen(
            command, env={**os.environ, "PYTHONPATH": str(ROOT), "MOJOCCL_HOSTID": f"node{node}",
                          "PYTHONFAULTHANDLER": "1", **env},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True))
    outputs = []
    deadline = time.monotonic() + timeout
    for agent in agents:
        try:
            outputs.append(agent.communicate(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            unfinished = agents[len(outputs):]
            for other in unfinished:
                end_hung_job(other.pid)
            stacks = "\n".join(other.communicate()[1][-4000:] for other in unfinished)
            raise AssertionError(f"the agents did not finish within {timeout} s:\n{stacks}") from None
        assert agent.returncode == 0, outputs[-1][1][-6000:]
    return outputs


def test_ddp_over_two_torchrun_agents_matches_one_node(tmp_path):
    script = [str(ROOT / "examples" / "train_ddp.py"), "--steps", "40", "--save", str(tmp_path / "x-{rank}.pt")]
    outputs = torchrun_agents(2, script, {**FABRIC, "MOJOCCL_IB_TRACE": "1"})
    stdout = "".join(out for out, _ in outputs)
    stderr = "".join(err for _, err in outputs)
    assert "backend mojo, world size 4" in stdout
    for rank in range(4):
        assert f"[mojoccl] rank {rank}: node {rank // 2} of 2" in stderr
    one_node, _ = run_torchrun(script, 4)
    assert losses(stdout) == pytest.approx(losses(one_node), rel=1e-4)


@pytest.fixture
def two_namespaces():
    """Two network namespaces joined by a veth pair: each "node" has only its
    own end (10.77.0.1 and .2) and loopback, so the bootstrap and libfabric
    must use the interface MOJOCCL_SOCKET_IFNAME names."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2's `ip`")
    tag = f"tm{os.getpid() % 100000}"
    spaces = [f"{tag}a", f"{tag}b"]
    commands = [
        *[["ip", "netns", "add", space] for space in spaces],
        ["ip", "link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b"],
    ]
    for index, space in enumerate(spaces):
        commands += [
            ["ip", "link", "set", space, "netns", space],  # each end is named after its namespace
            ["ip", "-n", space, "addr", "add", f"10.77.0.{index + 1}/24", "dev", space],
            ["ip", "-n", space, "link", "set", space, "up"],
            ["ip", "-n", space, "link", "set", "lo", "up"],
        ]
    try:
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"this machine does not allow network namespaces: {' '.join(command)}: "
                            f"{done.stderr.strip()}")
        yield spaces
    finally:
        for space in spaces:
            subprocess.run(["ip", "netns", "del", space], capture_output=True)


def test_nodes_in_separate_network_namespaces(two_namespaces):
    tag = two_namespaces[0][:-1]
    in_namespace = ["sh", "-c", 'exec ip netns exec "$TEST_NETNS" "$0" "$@"', sys.executable,
                    str(ROOT / "tests" / "workers" / "collectives.py"), "--quick"]
    # Each end of the veth pair is named after its namespace; the matrix's
    # gloo reference group needs its interface named too.
    placement = {rank: {"TEST_NETNS": space, "MOJOCCL_HOSTID": space, "GLOO_SOCKET_IFNAME": space}
                 for rank, space in enumerate(two_namespaces[rank // 2] for rank in range(4))}
    env = {**FABRIC, "MOJOCCL_SOCKET_IFNAME": tag, "MOJOCCL_IB_TRACE": "1", "MASTER_ADDR": "10.77.0.1"}
    results = run_ranks(in_namespace, 4, env=env, rank_env=placement, timeout=180)
    for result in results:
        assert "checked" in result.stdout
        space = two_namespaces[result.rank // 2]
        assert f"between nodes: tcp;ofi_rxm on {space} " in result.stderr, result.stderr[-2000:]


PRELOAD_SCRIPT = """
import os, signal, time
import torch_mojo
torch_mojo.register_mojo_devices()
time.sleep(0.05)  # the load has begun: provider libraries probe for their hardware
seen = []
signal.signal(signal.SIGTERM, lambda *_: seen.append('handled'))
child = os.fork()
if child == 0:
    import ctypes
    ctypes.CDLL('libz.so.1')  # the dynamic loader is free in the child
    os._exit(7)
print('child', os.waitpid(child, 0)[1] >> 8, flush=True)
time.sleep(1)
print('libfabric loaded', 'libfabric' in open('/proc/self/maps').read(), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print('SIGTERM', seen, flush=True)
"""


@pytest.mark.parametrize("local_world, loaded", [("1", "True"), ("2", "False")], ids=["across nodes", "one node"])
def test_a_job_across_nodes_loads_libfabric_in_the_background(local_world, loaded):
    # register_mojo_devices() starts the load where LOCAL_WORLD_SIZE is below
    # WORLD_SIZE; a fork meanwhile gets a usable loader, and a handler the
    # program installs during the load stays (the load puts back only those
    # that provider libraries install).
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": local_world}
    result = subprocess.run([sys.executable, "-c", PRELOAD_SCRIPT], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "child 7" in result.stdout and f"libfabric loaded {loaded}" in result.stdout, result.stdout
    assert "SIGTERM ['handled']" in result.stdout, result.stdout
