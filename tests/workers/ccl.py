"""One rank of a libmojoccl scenario, driven through the C API.

Usage: ccl.py SCENARIO. Prints "ok ..." lines or "error <code> <message>";
the test reads them.
"""

import os
import signal
import sys
import threading
import time

import numpy as np

from torch_mojo.mojoccl import CclError, Library


def shared_unique_id(library: Library, rank: int, scratch: str, timeout=30, name="unique_id") -> bytes:
    """Rank 0 makes the unique id; the others read it from a file, as a
    launcher's store would carry it."""
    path = os.path.join(scratch, name)
    if rank == 0:
        uid = library.unique_id()
        with open(path + ".tmp", "wb") as file:
            file.write(uid)
        os.rename(path + ".tmp", path)
        return uid
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError("rank 0 never published the unique id")
        time.sleep(0.01)
    with open(path, "rb") as file:
        return file.read()


def attempt(label, call):
    """Runs `call`; if it fails, prints `label code message` and how long it
    took to fail. Returns whether it failed."""
    start = time.monotonic()
    try:
        call()
        return False
    except CclError as error:
        print(f"{label} {error.code} {error.message}", flush=True)
        print(f"{label} after {time.monotonic() - start:.1f} s", flush=True)
        return True


def main():
    scenario = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    nranks = int(os.environ.get("CLAIMED_NRANKS", world))
    claimed_rank = int(os.environ.get("CLAIMED_RANK", rank))
    library = Library()
    if "UNIQUE_ID_HEX" in os.environ:  # made by the test itself
        uid = bytes.fromhex(os.environ["UNIQUE_ID_HEX"])
    else:
        uid = shared_unique_id(library, rank, os.environ["TEST_SCRATCH"])
    try:
        comm = library.init(nranks, uid, claimed_rank)
    except CclError as error:
        print(f"error {error.code} {error.message}", flush=True)
        return
    print("ok init", flush=True)

    data = np.arange(1000, dtype=np.float32) * (rank + 1)
    out = np.empty_like(data)
    if scenario == "init":
        library.all_reduce(comm, data, out)
        assert np.array_equal(out, np.arange(1000, dtype=np.float32) * world * (world + 1) / 2)
        print("ok all_reduce", flush=True)
        rounds, traffic = library.setup_traffic(comm)
        seconds = library.setup_seconds(comm)
        print(f"setup rounds {rounds} bytes {traffic} phases {len(seconds)} "
              f"between nodes {'yes' if seconds[3] > 0 else 'no'}", flush=True)
    elif scenario == "rebuilt":
        # The communicator replaced 4 times, as torchft replaces its group at
        # each quorum change; every one's all-reduce checked.
        for round_number in range(1, 5):
            library.destroy(comm)
            uid = shared_unique_id(library, rank, os.environ["TEST_SCRATCH"], name=f"unique_id_{round_number}")
            comm = library.init(nranks, uid, claimed_rank)
            data = np.arange(1000, dtype=np.float32) * (rank + round_number)
            library.all_reduce(comm, data, out)
            expected = np.arange(1000, dtype=np.float32) * (world * (world - 1) / 2 + world * round_number)
            assert np.array_equal(out, expected), round_number
            print(f"ok round {round_number}", flush=True)
        # A spare is being opened now: a child of fork() that ends through
        # exit() (static destructors run) must not wait for it.
        child = os.fork()
        if child == 0:
            sys.exit(0)
        deadline = time.monotonic() + 10
        while os.waitpid(child, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(child, signal.SIGKILL)
                raise AssertionError("a forked child hung at its exit")
            time.sleep(0.01)
        print("ok forked child exited", flush=True)
    elif scenario == "peer_exits":
        if rank == 1:
            os._exit(0)  # gone without a word
        if attempt("error", lambda: library.all_reduce(comm, data, out)):
            print(f"async {library.async_error(comm)}", flush=True)
            attempt("again", lambda: library.all_reduce(comm, data, out))
    elif scenario == "straggler":
        if rank == 1:
            time.sleep(float(os.environ.get("SLEEP_S", "8")))  # alive, but late
            os._exit(0)
        attempt("error", lambda: library.all_reduce(comm, data, out))
    elif scenario in ("dies_in_collective", "dies_in_send"):
        # Rank VICTIM kills itself between two calls; every survivor's next
        # call fails. In "dies_in_send", ranks r and r ^ 2 (on the other
        # node) exchange messages instead of reducing.
        victim = int(os.environ["VICTIM"])
        step, give_up = 0, time.monotonic() + 30
        while time.monotonic() < give_up:
            step += 1
            if rank == victim and step == 20:
                print(f"killed at {time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if scenario == "dies_in_collective":
                call = lambda: library.all_reduce(comm, data, out)
            elif rank < 2:
                call = lambda: (library.send(comm, data, rank ^ 2), library.recv(comm, out, rank ^ 2))
            else:
                call = lambda: (library.recv(comm, out, rank ^ 2), library.send(comm, data, rank ^ 2))
            if attempt("error", call):
                print(f"failed at {time.time():.3f}", flush=True)
                break
        print(f"steps {step}", flush=True)
    elif scenario == "node_leaves_early":
        # The second node's ranks destroy the communicator and exit, rank 2
        # right after sending rank 0 a large and a small message, which rank
        # 0 still receives after they left; the first node's ranks go on
        # with messages between themselves.
        library.all_reduce(comm, data, out)
        large = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: taken by rendezvous, as rank 0 progresses
        if rank >= 2:
            if rank == 2:
                library.send(comm, large, 0)
                library.send(comm, data, 0)
            library.lib.ncclCommDestroy(comm)
            os._exit(0)
        time.sleep(1.5)
        if rank == 0:
            late_large, late_small = np.empty_like(large), np.empty_like(data)
            library.recv(comm, late_large, 2)
            library.recv(comm, late_small, 2)
            assert np.array_equal(late_large, large) and np.array_equal(late_small, data * 3)  # rank 2's
            print("ok the last messages of a rank that left", flush=True)
        for _ in range(10):
            library.send(comm, data, 1 - rank) if rank == 0 else library.recv(comm, out, 0)
            library.recv(comm, out, 1) if rank == 0 else library.send(comm, data, 0)
        print("ok after the node left", flush=True)
    elif scenario == "abort":
        if rank == 1:
            time.sleep(float(os.environ.get("SLEEP_S", "20")))  # alive, but never joins
            return
        threading.Timer(0.5, lambda: library.lib.ncclCommAbort(comm)).start()
        attempt("error", lambda: library.all_reduce(comm, data, out))
        attempt("again", lambda: library.all_reduce(comm, data, out))
        os._exit(0)
    elif scenario == "sealed":
        # All-reduces of several sizes and swaps with the next rank for
        # SECONDS, every result checked, while strangers knock (test_sealed_jobs).
        wrong = rounds = 0
        end = time.monotonic() + float(os.environ.get("SECONDS", "3"))
        go_on = np.empty(1, dtype=np.float32)
        while True:
            library.all_reduce(comm, np.array([rank == 0 and time.monotonic() < end], dtype=np.float32), go_on)
            if go_on[0] == 0:  # rank 0's clock decides for all
                break
            for count in (2, 1000, 20_000):
                mine = np.arange(count, dtype=np.float32) % 1000 * (rank + 1)
                total = np.empty_like(mine)
                library.all_reduce(comm, mine, total)
                wrong += int(np.count_nonzero(total != np.arange(count, dtype=np.float32) % 1000 * world * (world + 1) / 2))
            peer = rank ^ 1
            if peer < world:
                got = np.empty_like(data)
                library.check(library.lib.ncclGroupStart())
                library.send(comm, data, peer)
                library.recv(comm, got, peer)
                library.check(library.lib.ncclGroupEnd())
                wrong += int(np.count_nonzero(got != np.arange(1000, dtype=np.float32) * (peer + 1)))
            rounds += 1
        print(f"ok sealed rounds={rounds} wrong={wrong} rejected={library.rejected(comm)}", flush=True)
    elif scenario == "bad_arguments":
        for label, call in [
            ("datatype", lambda: library.all_reduce(comm, data, out, datatype=42)),
            ("op", lambda: library.all_reduce(comm, data, out, op=9)),
            ("root", lambda: library.check(library.lib.ncclBroadcast(
                data.ctypes.data, out.ctypes.data, data.size, 7, world, comm, None))),
            ("null", lambda: library.check(library.lib.ncclAllReduce(
                None, None, 4, 7, 0, comm, None))),
            ("group_end", lambda: library.check(library.lib.ncclGroupEnd())),
            ("all_to_all_null", lambda: library.check(library.lib.ncclAllToAllv(
                data.ctypes.data, None, None, out.ctypes.data, None, None, 7, comm, None))),
            ("wire_here", lambda: library.check(library.lib.mojocclWireSendRecv(
                data.ctypes.data, 1 - rank, out.ctypes.data, 1 - rank, data.nbytes, comm))),
        ]:
            try:
                call()
                print(f"{label} accepted", flush=True)
            except CclError as error:
                print(f"{label} error {error.code} {error.message}", flush=True)
        library.all_reduce(comm, data, out)  # still usable
        print("ok usable", flush=True)
    elif scenario == "group":
        # Calls queued in a group run at ncclGroupEnd, in order.
        second = np.empty_like(data)
        library.check(library.lib.ncclGroupStart())
        library.all_reduce(comm, data, out)
        library.all_reduce(comm, out, second)
        library.check(library.lib.ncclGroupEnd())
        expected = np.arange(1000, dtype=np.float32) * world * (world + 1) / 2 * world
        assert np.array_equal(second, expected), second[:4]
        print("ok group", flush=True)
    elif scenario == "all_to_all":
        # Uneven parts (none, 3 elements, more than a staging slot holds for
        # one receiver in a step) from private memory, from ncclMemAlloc
        # memory, and in place (one buffer sent from and received into:
        # counts depend on sender + receiver, so both layouts coincide).
        import ctypes

        import torch

        part_count = lambda s, r: [0, 3, 200_003][(s + r) % 3]
        part = lambda s, r: np.arange(part_count(s, r), dtype=np.float32) + 1000 * s + 10 * r
        sizes = lambda counts: (ctypes.c_size_t * world)(*counts)
        counts = [part_count(rank, r) for r in range(world)]
        displacements = [sum(counts[:r]) for r in range(world)]
        expected = np.concatenate([part(s, rank) for s in range(world)])
        for mode in ("private", "registered", "in place"):
            send = np.concatenate([part(rank, r) for r in range(world)])
            if mode == "registered":
                pool = library.shared_tensor(2 * send.size)
                pool[:send.size] = torch.from_numpy(send)
                send, recv = pool[:send.size].numpy(), pool[send.size:].numpy()
            recv = send if mode == "in place" else (recv if mode == "registered" else np.full_like(send, -1))
            library.check(library.lib.ncclAllToAllv(send.ctypes.data, sizes(counts), sizes(displacements),
                                                    recv.ctypes.data, sizes(counts), sizes(displacements),
                                                    7, comm, None))
            assert np.array_equal(recv, expected), (mode, np.flatnonzero(recv != expected)[:5])
            print(f"ok all_to_all {mode}", flush=True)
    elif scenario == "broadcast":
        # From every root: 1 MiB of float32, and 1,000,001 bytes (an odd
        # count: on rails, slices that the node's ranks do not divide).
        for dtype, count in ((np.float32, 1 << 18), (np.uint8, 1_000_001)):
            for root in range(world):
                expected = (np.arange(count) * (root + 3)).astype(dtype)
                buffer = expected.copy() if rank == root else np.zeros(count, dtype=dtype)
                library.broadcast(comm, buffer, root)
                assert np.array_equal(buffer, expected), (dtype, root)
        print("ok broadcast", flush=True)
    elif scenario == "registered":
        # ncclMemAlloc memory, used three times, freed, then a new region.
        import gc

        for region in range(2):
            tensor = library.shared_tensor(100_000)
            for _ in range(3):
                tensor.fill_(rank + 1)
                library.all_reduce(comm, tensor.numpy(), tensor.numpy())
                assert float(tensor[0]) == world * (world + 1) / 2
            del tensor
            gc.collect()
            print(f"ok region {region}", flush=True)
    library.lib.ncclCommDestroy(comm)


if __name__ == "__main__":
    main()
