"""libmojoccl on its own, through NCCL's C API: set-up failures, dead and
stuck peers, bad arguments. Each must end in a clear error on every rank,
in bounded time."""

import glob
import os
import time

import pytest

from torch_mojo.mojoccl import INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR, Library
from tests.harness import run_worker


def lines(result, prefix):
    return [line for line in result.stdout.splitlines() if line.startswith(prefix)]


def test_version_and_error_strings():
    library = Library()
    assert library.version() == 100  # 0.1.0, encoded as NCCL encodes versions
    assert library.lib.ncclGetErrorString(REMOTE_ERROR).decode().startswith("remote process")


@pytest.mark.parametrize("world_size", [1, 3])
def test_init_and_all_reduce_leave_no_shared_memory_behind(world_size):
    before = set(glob.glob("/dev/shm/mojoccl-*"))
    results = run_worker("ccl", world_size, "init", timeout=60)
    assert all("ok all_reduce" in result.stdout for result in results)
    assert set(glob.glob("/dev/shm/mojoccl-*")) <= before


def test_ranks_that_disagree_on_nranks():
    results = run_worker("ccl", 2, "init", rank_env={1: {"CLAIMED_NRANKS": "3"}}, timeout=60)
    for result in results:
        assert "every rank must pass the same nranks" in result.stdout, result.stdout


def test_two_processes_claiming_one_rank():
    results = run_worker("ccl", 2, "init", rank_env={1: {"CLAIMED_RANK": "0"}}, timeout=60)
    for result in results:
        assert "two processes both joined as rank 0" in result.stdout, result.stdout


def test_a_rank_that_never_joins_is_named_after_the_bootstrap_timeout():
    start = time.monotonic()
    (result,) = run_worker(
        "ccl", 1, "init", env={"CLAIMED_NRANKS": "2", "MOJOCCL_BOOTSTRAP_TIMEOUT_S": "2"}, timeout=60
    )
    assert f"error {INVALID_USAGE} rank(s) 1 of 2 did not join the communicator within 2 s" in result.stdout
    assert time.monotonic() - start < 30


def test_a_peer_that_exits_is_reported_promptly():
    results = run_worker("ccl", 2, "peer_exits", timeout=60)
    out = results[0].stdout
    assert f"error {REMOTE_ERROR}" in out and "rank 1 (pid" in out and "exited" in out, out
    seconds = float(lines(results[0], "error after")[0].split()[2])
    assert seconds < 5, out
    assert f"async {REMOTE_ERROR}" in out, out
    assert "unusable after an earlier error" in lines(results[0], "again")[0], out


def test_abort_ends_a_collective_waiting_on_a_live_peer():
    results = run_worker("ccl", 2, "abort", env={"SLEEP_S": "3"}, timeout=60)
    out = results[0].stdout
    assert "the communicator was aborted" in lines(results[0], "error")[0], out
    assert float(lines(results[0], "error after")[0].split()[2]) < 3, out
    assert "aborted" in lines(results[0], "again")[0], out


def test_bad_arguments_are_refused_and_the_comm_stays_usable():
    results = run_worker("ccl", 2, "bad_arguments", timeout=60)
    for rank, result in enumerate(results):
        out = result.stdout
        assert f"datatype error {INVALID_ARGUMENT} unknown datatype 42" in out, out
        assert f"op error {INVALID_ARGUMENT} unknown reduction op 9" in out, out
        assert "root error" in out and "root 2 is outside 0..1" in out, out
        assert "null error" in out and "NULL" in out, out
        assert f"group_end error {INVALID_USAGE}" in out, out
        assert (f"all_to_all_null error {INVALID_ARGUMENT} ncclAllToAllv: sendcounts, sdispls, recvcounts and "
                "rdispls need an entry per rank") in out, out
        assert (f"wire_here error {INVALID_USAGE} mojocclWireSendRecv: rank {1 - rank} is not a rank of this "
                "communicator on another node") in out, out
        assert "ok usable" in out, out


@pytest.mark.parametrize("zero_copy", ["1", "0"], ids=["parts read in place", "parts staged"])
def test_uneven_all_to_all_within_a_node(zero_copy):
    # 3 ranks, parts of 0, 3 and 200,003 float32 (more than a receiver's
    # share of a staging slot: staged, they take 3 steps), from private
    # memory, ncclMemAlloc memory and in place.
    results = run_worker("ccl", 3, "all_to_all", env={"MOJOCCL_ZERO_COPY": zero_copy}, timeout=60)
    for result in results:
        for mode in ("private", "registered", "in place"):
            assert f"ok all_to_all {mode}" in result.stdout, result.stdout + result.stderr[-3000:]


def test_group_calls_run_in_order_at_group_end():
    results = run_worker("ccl", 3, "group", timeout=60)
    assert all("ok group" in result.stdout for result in results)


@pytest.mark.parametrize(
    "variable, value, expected",
    [
        ("MOJOCCL_ALGO", "fastest", "MOJOCCL_ALGO=fastest is not valid: expected one of auto, one_shot, two_shot"),
        ("MOJOCCL_BOOTSTRAP_TIMEOUT_S", "soon", "MOJOCCL_BOOTSTRAP_TIMEOUT_S=soon is not valid: expected an integer"),
        ("MOJOCCL_SOCKET_IFNAME", "nosuchif0", "MOJOCCL_SOCKET_IFNAME=nosuchif0 matches no interface"),
    ],
)
def test_bad_environment_values_name_the_variable(variable, value, expected):
    # Found at ncclGetUniqueId or ncclCommInitRank, whichever reads it first.
    results = run_worker("ccl", 1, "init", env={variable: value}, timeout=60, check=False)
    assert expected in results[0].stdout + results[0].stderr


def test_strangers_on_the_bootstrap_port_do_not_disturb_the_job():
    # The unique id holds the root's address (after an 8-byte magic, the
    # 8-byte secret and a 4-byte length: a sockaddr_in) and the secret that
    # ranks must present. Connections without it are dropped.
    import os
    import socket
    import struct

    library = Library()
    uid = library.unique_id()
    family, port = struct.unpack_from("=H", uid, 20)[0], struct.unpack_from("!H", uid, 22)[0]
    host = socket.inet_ntoa(uid[24:28])
    assert family == socket.AF_INET
    for payload in (os.urandom(64), os.urandom(104), b"", b"GET / HTTP/1.0\r\n\r\n" * 8):
        with socket.create_connection((host, port), timeout=5) as stranger:
            stranger.sendall(payload)
    results = run_worker("ccl", 2, "init", env={"UNIQUE_ID_HEX": uid.hex()}, timeout=60)
    assert all("ok all_reduce" in result.stdout for result in results)


# The bootstrap's tree (base/bootstrap_wire.h) at 19 ranks: rank 0 heads
# ranks 1, 3, 5, 7, 10, 12, 14 and 16, each heading a run of 2 or 3
# (rank 9 sits under 7, 13 under 12, 17 and 18 under 16).
TREE = 19


def test_a_tree_of_ranks_sets_up():
    results = run_worker("ccl", TREE, "init", timeout=120)
    assert all("ok all_reduce" in result.stdout for result in results)


def test_the_first_rank_that_differs_is_found_below_the_top_of_the_tree():
    results = run_worker("ccl", TREE, "init", timeout=120, rank_env={
        13: {"MOJOCCL_ZERO_COPY": "0"}, 17: {"MOJOCCL_ALGO": "two_shot"}})
    for result in results:
        assert ("MOJOCCL_ZERO_COPY is '1' on rank 0 and '0' on rank 13: set it alike on every rank"
                in result.stdout), result.stdout


def test_the_lowest_failing_rank_below_the_top_of_the_tree_is_named():
    results = run_worker("ccl", TREE, "init", timeout=120, rank_env={
        9: {"MOJOCCL_ALGO": "fastest"}, 18: {"MOJOCCL_ALGO": "slowest"}})
    for result in results:
        assert "rank 9: MOJOCCL_ALGO=fastest is not valid" in result.stdout, result.stdout


def test_a_thousand_ranks_rehearsed_in_threads_set_up_and_one_that_leaves_is_named():
    # mojocclRehearseBootstrap: the ranks are threads of this process, each
    # making 18 exchanges (5 all-gathers of 414 bytes in all), as a set-up
    # across nodes makes them.
    library = Library()
    results = library.rehearse_bootstrap(library.unique_id(), 1000, range(1000), 18, 5, 414)
    assert [status for _, status, _ in results] == [0] * 1000, results[:3]
    # Rank 2 heads ranks 2..16 under rank 1; it leaves after the table, as a
    # process that dies in set-up: every other rank fails at once, naming it.
    results = library.rehearse_bootstrap(library.unique_id(), 1000, range(1000), 18, 5, 414, leaver=2)
    for rank, (seconds, status, message) in enumerate(results):
        if rank == 2:
            continue
        assert status == REMOTE_ERROR and "rank 2 " in message and "left the communicator set-up" in message, (
            rank, message)
        assert seconds < 20, (rank, seconds)


def test_a_root_without_a_file_per_rank_tells_every_rank_what_to_raise():
    # The root holds a connection per rank; where rank 0's process may open
    # too few files, every rank learns it as it arrives.
    import subprocess
    import sys

    root = subprocess.Popen(
        [sys.executable, "-c",
         "import resource, sys, time\n"
         "resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))\n"
         "from torch_mojo.mojoccl import Library\n"
         "print(Library().unique_id().hex(), flush=True)\n"
         "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        uid = bytes.fromhex(root.stdout.readline().strip())
        library = Library()
        start = time.monotonic()
        results = library.rehearse_bootstrap(uid, 300, range(300), 0, 0, 0)
        for seconds, status, message in results:
            assert status == INVALID_USAGE and ("300 ranks need about 364 open files, and rank 0's process may open "
                                                "100 (raise `ulimit -n` where rank 0 runs)") in message, message
        assert time.monotonic() - start < 30
    finally:
        root.stdin.close()
        root.wait(timeout=30)
