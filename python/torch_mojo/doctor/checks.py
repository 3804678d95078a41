"""The problems of a job, from every rank's facts and the measurements.

A problem is {"severity", "kind", "message", "ranks"}: "error" where
training would fail or crawl (the doctor then exits non-zero), "warning"
where a setting has no effect or works against the job; its kind is one of
KINDS. Every message says what to set or do.
"""

from __future__ import annotations

import statistics

from torch_mojo.doctor.facts import SOCKET_PROVIDERS, cpu_ranges
from torch_mojo.doctor.job import Job
from torch_mojo.doctor.variables import ERROR, WARNING

# Variables that may rightly differ between ranks or nodes (a node's own
# NIC names, a rank's own files); every other one must be alike on all.
PER_RANK = {"MOJOCCL_HOSTID", "MOJOCCL_FABRIC_DOMAIN", "MOJOCCL_SOCKET_IFNAME", "NCCL_IB_HCA",
            "NCCL_SOCKET_IFNAME", "FI_TCP_IFACE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}


KINDS = ("missing", "environment", "libraries", "fabric", "cores", "cache", "measurement")
# Errors of these kinds make the measurements fail or hang: they are
# skipped until the errors are fixed.
STOPS_MEASUREMENTS = {"missing", "environment", "libraries", "fabric"}


def rank_ranges(ranks) -> str:
    text = cpu_ranges(ranks)
    return ("ranks " if "," in text or "-" in text else "rank ") + text


def problem(severity: str, kind: str, message: str, ranks) -> dict:
    return {"severity": severity, "kind": kind, "message": message, "ranks": sorted(ranks)}


def nodes_of(job: Job) -> dict[str, list[int]]:
    """{node: its ranks}, nodes in the order of their first rank."""
    nodes: dict[str, list[int]] = {}
    for rank in sorted(job.facts):
        nodes.setdefault(job.facts[rank]["node"], []).append(rank)
    return nodes


def missing_ranks(job: Job, timeout: float) -> list[dict]:
    if not job.missing:
        return []
    hosts = sorted({facts["host"] for facts in job.facts.values()})
    return [problem(ERROR, "missing", f"{rank_ranges(job.missing)} never checked in within {timeout:.0f} s "
                    f"(MOJOCCL_BOOTSTRAP_TIMEOUT_S): were they started, and can they reach "
                    f"MASTER_ADDR? The others run on {', '.join(hosts) or 'no host'}", job.missing)]


def reported_by_ranks(job: Job) -> list[dict]:
    """What each rank found in its own environment, once per message."""
    by_message: dict[tuple[str, str, str], list[int]] = {}
    for rank, facts in job.facts.items():
        for severity, message in facts["problems"]:
            by_message.setdefault((severity, "environment", message), []).append(rank)
        if facts.get("device_error"):
            by_message.setdefault((ERROR, "libraries", facts["device_error"]), []).append(rank)
    return [problem(*key, ranks) for key, ranks in by_message.items()]


def shared_cores(job: Job) -> list[dict]:
    found = []
    for ranks in nodes_of(job).values():
        host = job.facts[ranks[0]]["host"]
        cpus = {rank: frozenset(job.facts[rank]["cpus"]) for rank in ranks}
        union = frozenset().union(*cpus.values())
        if len(union) < len(ranks):
            found.append(problem(ERROR, "cores", f"{len(ranks)} ranks on {host} share {len(union)} "
                                 f"core{'s' if len(union) > 1 else ''} ({cpu_ranges(union)}): the launcher pinned "
                                 "them together; give each rank cores of its own (srun --cpu-bind=cores with "
                                 "-c N, mpirun --bind-to core --map-by slot:PE=N, or no taskset around torchrun)",
                                 ranks))
            continue
        online = job.facts[ranks[0]]["online_cpus"]
        groups: dict[frozenset, list[int]] = {}
        for rank, mine in cpus.items():
            if len(mine) < online:
                groups.setdefault(mine, []).append(rank)
        for mine, together in groups.items():
            if len(together) > 1:
                found.append(problem(WARNING, "cores", f"{rank_ranges(together)} on {host} are bound to the same cores "
                                     f"({cpu_ranges(mine)}): their reductions compete for them; bind each rank "
                                     "to cores of its own", together))
    return found


def fabric_problems(job: Job) -> list[dict]:
    nodes = nodes_of(job)
    spans_nodes = len(nodes) > 1
    found, chosen = [], {}
    for node, ranks in nodes.items():
        fabric, host = job.facts[ranks[0]]["fabric"], job.facts[ranks[0]]["host"]
        if fabric["failure"] and spans_nodes:
            found.append(problem(ERROR, "fabric", f"between nodes, on {host}: {fabric['failure']}", ranks))
            continue
        provider = fabric["provider"].split(";")[0]
        if provider in SOCKET_PROVIDERS and fabric["hardware"]:
            found.append(problem(
                ERROR if spans_nodes else WARNING, "fabric",
                f"on {host} collectives between nodes would go over TCP ({fabric['provider']}, from "
                f"{fabric['provider_source']}) although this node has a fabric NIC "
                f"({', '.join(fabric['hardware'])}): set MOJOCCL_FABRIC_PROVIDER={fabric['hardware'][0]}", ranks))
        if fabric["in_use"]:
            chosen[node] = fabric["in_use"].split(" (")[0]  # "tcp;ofi_rxm on lo"
    if spans_nodes and len(set(chosen.values())) > 1:
        listing = "; ".join(f"{job.facts[nodes[node][0]]['host']} ({rank_ranges(nodes[node])}): {text}"
                            for node, text in chosen.items())
        found.append(problem(ERROR, "fabric", "the nodes would not use the same libfabric provider and domain between "
                             f"nodes ({listing}): set MOJOCCL_FABRIC_PROVIDER (and MOJOCCL_FABRIC_DOMAIN or "
                             "MOJOCCL_SOCKET_IFNAME) so that every node reaches the others", sorted(job.facts)))
    return found


def differing_settings(job: Job) -> list[dict]:
    names = {name for facts in job.facts.values() for name in facts["environment"]} - PER_RANK
    found = []
    for name in sorted(names):
        values: dict[str, list[int]] = {}
        for rank, facts in job.facts.items():
            values.setdefault(facts["environment"].get(name, "unset"), []).append(rank)
        if len(values) > 1:
            listing = " and ".join(f"{value} on {rank_ranges(ranks)}" for value, ranks in values.items())
            found.append(problem(ERROR, "environment", f"{name} is {listing}: set it alike on every rank (export it before the "
                                 "launcher, or in the batch script)", sorted(job.facts)))
    return found


def library_problems(job: Job) -> list[dict]:
    found = []
    for what in ("torch_mojo", "torch"):
        versions = {}
        for rank, facts in job.facts.items():
            versions.setdefault(facts[what], []).append(rank)
        if len(versions) > 1:
            listing = " and ".join(f"{version} on {rank_ranges(ranks)}" for version, ranks in versions.items())
            found.append(problem(ERROR, "libraries", f"{what.replace('_', '-')} differs between ranks ({listing}): load the same "
                                 "installation on every node", sorted(job.facts)))
    broken: dict[str, list[int]] = {}
    loaded: dict[str, dict[str, list[int]]] = {}  # device: {library and version: ranks}
    for rank, facts in job.facts.items():
        for device, lookup in facts["libraries"].items():
            if lookup.get("load_error"):
                broken.setdefault(f"{lookup['path']} does not load: {lookup['load_error']}", []).append(rank)
            elif not lookup["path"]:
                broken.setdefault(f"no library for {device} tensors ({lookup['source']}; searched "
                                  f"{', '.join(lookup['searched'])})", []).append(rank)
            else:
                text = f"{lookup['path']} version {lookup.get('version')}"
                loaded.setdefault(device, {}).setdefault(text, []).append(rank)
    found += [problem(ERROR, "libraries", message, ranks) for message, ranks in broken.items()]
    for device, choices in loaded.items():
        if len(choices) > 1:
            listing = "; ".join(f"{text} on {rank_ranges(ranks)}" for text, ranks in choices.items())
            found.append(problem(ERROR, "libraries", f"the ranks load different libraries for {device} tensors ({listing}): "
                                 "every rank must load the same one", sorted(job.facts)))
    return found


def cache_problems(job: Job, seen_by: dict[int, list[str]]) -> list[dict]:
    """The cache directory should be one that every node sees: `seen_by`
    holds, for each rank, the nodes whose marker files it found there."""
    nodes = nodes_of(job)
    if len(nodes) < 2:
        return []
    blind = [rank for rank, seen in seen_by.items() if set(seen) != set(nodes)]
    if not blind:
        return []
    facts = job.facts[blind[0]]["cache"]
    return [problem(WARNING, "cache", f"the cache directory {facts['path']} is not shared between the nodes (a "
                    f"{facts['filesystem']} filesystem; {rank_ranges(blind)} do not see the other nodes' files "
                    "there): set TORCH_MOJO_BACKEND_CACHE_DIR to a directory on a filesystem every node mounts "
                    "(such as $SCRATCH/torch-mojo-cache)", blind)]


def measurement_problems(job: Job) -> list[dict]:
    found = [problem(ERROR, "measurement", f"the measurements failed: {message}", [rank]) for rank, message in job.failures.items()]
    for kind in ("within node", "between nodes"):
        links = [link for link in job.links if link["kind"] == kind]
        if len(links) < 3:
            continue
        typical = statistics.median(link["bandwidth_gbps"] for link in links)
        for link in links:
            if link["bandwidth_gbps"] < typical / 4:
                found.append(problem(WARNING, "measurement", f"the link {kind} between ranks {link['a']} and {link['b']} runs at "
                                     f"{link['bandwidth_gbps']:.2f} GB/s, under a quarter of the others' median "
                                     f"({typical:.2f} GB/s): check that node's NIC, cabling or binding",
                                     [link["a"], link["b"]]))
    return found


def ordered(problems: list[dict]) -> list[dict]:
    return sorted(problems, key=lambda item: (item["severity"] != ERROR, KINDS.index(item["kind"]), item["ranks"][:1]))


def before_measurements(job: Job, timeout: float) -> list[dict]:
    """What the ranks' facts show."""
    found = [*missing_ranks(job, timeout), *reported_by_ranks(job)]
    if job.facts:
        found += [*shared_cores(job), *fabric_problems(job), *differing_settings(job), *library_problems(job)]
    return ordered(found)


def measurements_possible(problems: list[dict]) -> bool:
    return not any(item["severity"] == ERROR and item["kind"] in STOPS_MEASUREMENTS for item in problems)


def after_measurements(job: Job, seen_by: dict[int, list[str]]) -> list[dict]:
    """What the measurements and the cache markers show."""
    return ordered([*cache_problems(job, seen_by), *measurement_problems(job)])
