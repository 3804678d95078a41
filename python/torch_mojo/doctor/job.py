"""The doctor's job: every rank posts its facts to the job's store, and
rank 0 waits for each one up to the bootstrap timeout (a rank that never
starts is reported missing, not waited for). When every rank checked in,
the ranks open a `mojo` process group and measure the links, pair by pair:
within each node between its first two ranks, and between nodes between
their first ranks (every pair of nodes, in rounds of disjoint pairs, up to
16 nodes; beyond, each node with the next). A world all-reduce checks the
result on every rank; where GPU tensors go to RCCL or NCCL, one on the
GPU too, with the library logging which network it chose between nodes
(nccl_log reads the lines). Rank 0 ends with the whole job's facts and
links.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field

from torch_mojo.doctor import nccl_log

# The store's keys, under their own prefix in the job's store.
PREFIX = "torch-mojo-doctor"


@dataclass
class Job:
    facts: dict[int, dict]  # rank: its facts
    missing: list[int]  # ranks that never checked in
    broken: dict[int, str] = field(default_factory=dict)  # rank: why it could not gather its facts
    links: list[dict] = field(default_factory=list)  # measured pairs
    failures: dict[int, str] = field(default_factory=dict)  # rank: what failed in the measurements
    all_reduce: dict | None = None
    vendor_networks: dict[str, nccl_log.HostLog] = field(default_factory=dict)  # host: RCCL/NCCL's choice


class MeasurementFailed(RuntimeError):
    """A rank's measurements failed (and the failure was posted for rank 0)."""


def connect(timeout: float):
    """The job's store: torchrun's agent store, or one rank 0 serves."""
    import torch.distributed as dist

    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    wait = datetime.timedelta(seconds=timeout)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.TCPStore(address, port, is_master=False, timeout=wait)
    else:
        store = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=wait,
                              wait_for_workers=False)
    return dist.PrefixStore(PREFIX, store)


def posted(store, keys: list[str], deadline: float) -> dict[str, object]:
    """{key: its JSON value} of the `keys` posted before `deadline`."""
    values, waiting = {}, list(keys)
    while waiting:
        for key in [key for key in waiting if store.check([key])]:
            raw = store.get(key)
            values[key] = json.loads(raw) if raw else None
            waiting.remove(key)
        if not waiting or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return values


def collect_facts(store, world_size: int, deadline: float) -> Job:
    """Rank 0: every rank's facts that arrive before `deadline`."""
    values = posted(store, [f"facts/{rank}" for rank in range(world_size)], deadline)
    job = Job({}, [rank for rank in range(world_size) if f"facts/{rank}" not in values])
    for facts in values.values():
        if "gather_error" in facts:
            job.broken[facts["rank"]] = facts["gather_error"]
        else:
            job.facts[facts["rank"]] = facts
    return job


def wait_for(store, key: str, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    while not store.check([key]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not answer within {timeout:.0f} s")
        time.sleep(0.05)
    return store.get(key)


def node_pairs(count: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint node pairs: all pairs (the circle method) up to 16
    nodes, each node with the next beyond."""
    if count < 2:
        return []
    if count > 16:
        ring = [(node, (node + 1) % count) for node in range(count)]
        return [ring[0::2], ring[1::2]] if count % 2 == 0 else [ring[0:-1:2], ring[1::2], [ring[-1]]]
    seats = list(range(count)) + ([None] if count % 2 else [])
    rounds = []
    for _ in range(len(seats) - 1):
        pairs = [(seats[i], seats[-1 - i]) for i in range(len(seats) // 2)]
        rounds.append([tuple(sorted(pair)) for pair in pairs if None not in pair])
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return rounds


def plan(facts: dict[int, dict]) -> list[list[dict]]:
    """The measurement rounds: [{"a": rank, "b": rank, "kind": ...}, ...]."""
    nodes: dict[str, list[int]] = {}
    for rank in sorted(facts):
        nodes.setdefault(facts[rank]["node"], []).append(rank)
    ranks = list(nodes.values())
    within = [{"a": members[0], "b": members[1], "kind": "within node"} for members in ranks if len(members) > 1]
    rounds = [within] if within else []
    for pairs in node_pairs(len(ranks)):
        rounds.append([{"a": ranks[x][0], "b": ranks[y][0], "kind": "between nodes"} for x, y in pairs])
    return rounds


def ping_pong(tensor, peer: int, first: bool, iterations: int) -> float:
    """The median round trip of `tensor` to `peer` and back, in seconds."""
    import torch.distributed as dist

    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        if first:
            dist.send(tensor, peer)
            dist.recv(tensor, peer)
        else:
            dist.recv(tensor, peer)
            dist.send(tensor, peer)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_link(store, link: dict, rank: int, size: int):
    import torch

    first = rank == link["a"]
    peer = link["b"] if first else link["a"]
    small, large = torch.zeros(2), torch.zeros(size // 4)
    ping_pong(small, peer, first, 20)
    latency = ping_pong(small, peer, first, 200) / 2
    ping_pong(large, peer, first, 2)
    round_trip = ping_pong(large, peer, first, 10)
    if first:
        result = {**link, "latency_us": latency * 1e6, "bandwidth_gbps": 2 * size / round_trip / 1e9}
        store.set(f"link/{link['a']}-{link['b']}", json.dumps(result))


def check_all_reduce(rank: int, world_size: int, size: int) -> dict:
    """A world all-reduce of `size` bytes: its result on this rank and its
    bus bandwidth (nccl-tests' definition)."""
    import torch
    import torch.distributed as dist

    from torch_mojo.bench import BUS_FACTOR

    tensor = torch.full((size // 4,), float(rank + 1))
    dist.all_reduce(tensor)
    expected = world_size * (world_size + 1) / 2
    correct = bool((tensor == expected).all())
    times = []
    for _ in range(20):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    busbw = size * BUS_FACTOR["all_reduce"](world_size) / seconds / 1e9
    return {"bytes": size, "correct": correct, "time_us": seconds * 1e6, "busbw_gbps": busbw}


def vendor_library_device():
    """This rank's GPU, where its tensors go to RCCL or NCCL; else None."""
    from torch_mojo import libraries

    device = libraries.current_accelerator()
    if device is None or libraries.accelerator_lookup(device.type)[1] not in ("nccl", "rccl"):
        return None
    return device


def check_device_all_reduce(rank: int, world_size: int, device) -> bool:
    """An all-reduce of GPU tensors, through RCCL/NCCL: its result here."""
    import torch
    import torch.distributed as dist

    tensor = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(tensor)
    return bool((tensor.cpu() == world_size * (world_size + 1) / 2).all())


def measure(store, rounds: list[list[dict]], rank: int, world_size: int, size: int, timeout: float):
    """Every rank: the links of `rounds` this rank is in, then the world
    all-reduce. A failure is posted for rank 0, then raised as
    MeasurementFailed."""
    import torch.distributed as dist

    import torch_mojo

    os.environ["TORCH_MOJO_BACKEND_TRACE"] = "0"  # the report names the library
    device = vendor_library_device()
    log = nccl_log.log_here(tempfile.mkdtemp(prefix="torch-mojo-doctor-")) if device is not None else None
    try:
        torch_mojo.register_mojo_devices()
        dist.init_process_group("mojo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        for links in rounds:
            for link in links:
                if rank in (link["a"], link["b"]):
                    measure_link(store, link, rank, size)
            dist.barrier()
        result = check_all_reduce(rank, world_size, size)
        if device is not None:
            if not check_device_all_reduce(rank, world_size, device):
                store.set(f"failure/{rank}", f"the all-reduce of {device} tensors was wrong on this rank")
            logs = nccl_log.read([log]) if os.path.exists(log) else {}
            store.set(f"network/{rank}", json.dumps([nccl_log.to_json(each) for each in logs.values()]))
        if not result["correct"]:
            store.set(f"failure/{rank}", "the all-reduce result was wrong on this rank")
        elif rank == 0:
            store.set("all_reduce", json.dumps(result))
        dist.barrier()
        dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001  whatever failed is the report
        store.set(f"failure/{rank}", f"{type(error).__name__}: {error}")
        raise MeasurementFailed(str(error)) from error


def results(store, job: Job, rounds: list[list[dict]]):
    """Rank 0, after the measurements: what the ranks posted."""
    for link in (link for links in rounds for link in links):
        key = f"link/{link['a']}-{link['b']}"
        if store.check([key]):
            job.links.append(json.loads(store.get(key)))
    for rank in job.facts:
        if store.check([f"failure/{rank}"]):
            job.failures[rank] = store.get(f"failure/{rank}").decode()
    if store.check(["all_reduce"]):
        job.all_reduce = json.loads(store.get("all_reduce"))
    posted = [item for rank in job.facts if store.check([f"network/{rank}"])
              for item in json.loads(store.get(f"network/{rank}"))]
    job.vendor_networks = nccl_log.merged(posted)
