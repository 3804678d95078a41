"""The problems of a job, from every rank's facts and the measurements.

A problem is {"severity", "kind", "message", "ranks"}: "error" where
training would fail or crawl (the doctor then exits non-zero), "warning"
where a setting has no effect or works against the job; its kind is one of
KINDS. Every message says what to set or do.
"""

from __future__ import annotations

import statistics

from torch_mojo import site_settings
from torch_mojo.doctor import nccl_log
from torch_mojo.doctor.facts import number_ranges
from torch_mojo.fabric_info import SOCKET_PROVIDERS
from torch_mojo.doctor.job import Job
from torch_mojo.doctor.variables import ERROR, WARNING

KINDS = ("missing", "environment", "libraries", "fabric", "cores", "cache", "measurement")
# Errors of these kinds make the measurements fail or hang: they are
# skipped until the errors are fixed.
STOPS_MEASUREMENTS = {"missing", "environment", "libraries", "fabric"}

# Variables that may rightly differ between ranks or nodes (a node's own
# NIC names, a rank's own files); every other one must be alike on all.
PER_RANK = {"MOJOCCL_HOSTID", "MOJOCCL_FABRIC_DOMAIN", "MOJOCCL_SOCKET_IFNAME", "NCCL_IB_HCA",
            "NCCL_SOCKET_IFNAME", "FI_TCP_IFACE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}
LOOPBACK_DOMAINS = {"lo"}


def rank_ranges(ranks) -> str:
    text = number_ranges(ranks)
    return ("ranks " if "," in text or "-" in text else "rank ") + text


def problem(severity: str, kind: str, message: str, ranks) -> dict:
    return {"severity": severity, "kind": kind, "message": message, "ranks": sorted(ranks)}


def grouped(findings: dict[tuple[str, str, str], list[int]]) -> list[dict]:
    """{(severity, kind, message): ranks} as problems."""
    return [problem(*key, ranks) for key, ranks in findings.items()]


def nodes_of(job: Job) -> dict[str, list[int]]:
    """{node: its ranks}, nodes in the order of their first rank."""
    nodes: dict[str, list[int]] = {}
    for rank in sorted(job.facts):
        nodes.setdefault(job.facts[rank]["node"], []).append(rank)
    return nodes


def missing_ranks(job: Job, timeout: float) -> list[dict]:
    found = [problem(ERROR, "missing", f"could not gather its facts: {error}", [rank])
             for rank, error in job.broken.items()]
    if job.missing:
        hosts = sorted({facts["host"] for facts in job.facts.values()})
        found.append(problem(ERROR, "missing", f"never checked in within {timeout:.0f} s "
                             "(MOJOCCL_BOOTSTRAP_TIMEOUT_S): were these ranks started, and can they reach "
                             f"MASTER_ADDR? The others run on {', '.join(hosts) or 'no host'}", job.missing))
    return found


def reported_by_ranks(job: Job) -> list[dict]:
    """What each rank found in its own environment, once per message."""
    findings: dict[tuple[str, str, str], list[int]] = {}
    for rank, facts in job.facts.items():
        for severity, message in facts["problems"]:
            findings.setdefault((severity, "environment", message), []).append(rank)
        if facts.get("device_error"):
            findings.setdefault((ERROR, "libraries", facts["device_error"]), []).append(rank)
    return grouped(findings)


def shared_cores(job: Job) -> list[dict]:
    found = []
    for ranks in nodes_of(job).values():
        host = job.facts[ranks[0]]["host"]
        cpus = {rank: frozenset(job.facts[rank]["cpus"]) for rank in ranks}
        union = frozenset().union(*cpus.values())
        if len(union) < len(ranks):
            found.append(problem(
                ERROR, "cores", f"{len(ranks)} ranks on {host} share {len(union)} core{'s' * (len(union) > 1)} "
                f"({number_ranges(union)}): the launcher pinned them together; give each rank cores of its own "
                "(srun --cpu-bind=cores with -c N, mpirun --bind-to core --map-by slot:PE=N, or no taskset "
                "around torchrun)", ranks))
            continue
        online = job.facts[ranks[0]]["online_cpus"]
        together: dict[frozenset, list[int]] = {}
        for rank, mine in cpus.items():
            if len(mine) < online:
                together.setdefault(mine, []).append(rank)
        for mine, sharing in together.items():
            if len(sharing) > 1:
                found.append(problem(
                    WARNING, "cores", f"{rank_ranges(sharing)} on {host} are bound to the same cores "
                    f"({number_ranges(mine)}): their reductions compete for them; bind each rank to cores of "
                    "its own", sharing))
    return found


def fabric_problems(job: Job) -> list[dict]:
    """Every rank's way between nodes: usable, not TCP beside a fabric NIC,
    and the same provider (and, where it matters, domain) on all."""
    spans_nodes = len(nodes_of(job)) > 1
    findings: dict[tuple[str, str, str], list[int]] = {}
    for rank, facts in sorted(job.facts.items()):
        fabric, host = facts["fabric"], facts["host"]
        if fabric["failure"] and spans_nodes:
            findings.setdefault((ERROR, "fabric", f"between nodes, on {host}: {fabric['failure']}"), []).append(rank)
        provider = fabric["provider"].split(";")[0]
        if provider in SOCKET_PROVIDERS and fabric["hardware"]:
            message = (f"on {host} collectives between nodes would go over TCP ({fabric['provider']}, from "
                       f"{fabric['provider_source']}) although this node has a fabric NIC "
                       f"({', '.join(fabric['hardware'])}): set MOJOCCL_FABRIC_PROVIDER={fabric['hardware'][0]}")
            findings.setdefault((ERROR if spans_nodes else WARNING, "fabric", message), []).append(rank)
        plugin = facts.get("net_plugin")
        if spans_nodes and plugin and not plugin["path"] and facts["machine"]["network"] == "slingshot":
            library = "RCCL" if facts["machine"]["gpu"] == "amd" else "NCCL"
            message = (f"on {host} {library} would use sockets between nodes, many times slower: its libfabric "
                       f"plugin ({plugin['library']}) is not on the library path; {site_settings.PLUGIN_ADVICE}, "
                       f"and set NCCL_NET=\"{site_settings.PLUGIN_NETWORK}\"")
            findings.setdefault((ERROR, "fabric", message), []).append(rank)
    found = grouped(findings)
    if spans_nodes:
        found += disagreements(job)
    return found


def disagreements(job: Job) -> list[dict]:
    """Ranks that would open different providers (an error: they cannot
    talk) or domains (a warning, as NIC names may differ between nodes,
    except where one is the loopback interface, which other nodes cannot
    reach)."""
    providers: dict[str, list[int]] = {}
    domains: dict[str, list[int]] = {}
    for rank, facts in sorted(job.facts.items()):
        if facts["fabric"]["in_use"]:
            provider, _, domain = facts["fabric"]["in_use"].split(" (")[0].partition(" on ")
            providers.setdefault(provider, []).append(rank)
            domains.setdefault(domain, []).append(rank)
    found = []
    if len(providers) > 1:
        listing = "; ".join(f"{name} on {rank_ranges(ranks)}" for name, ranks in providers.items())
        found.append(problem(ERROR, "fabric", f"the ranks would not use the same libfabric provider between "
                             f"nodes ({listing}): set MOJOCCL_FABRIC_PROVIDER alike on every node", sorted(job.facts)))
    if len(domains) > 1:
        listing = "; ".join(f"{name} on {rank_ranges(ranks)}" for name, ranks in domains.items())
        severity = ERROR if LOOPBACK_DOMAINS & set(domains) else WARNING
        found.append(problem(severity, "fabric", f"the ranks would not use the same libfabric domain between nodes "
                             f"({listing}): where the nodes name their NICs alike, set MOJOCCL_FABRIC_DOMAIN (or "
                             "MOJOCCL_SOCKET_IFNAME) to one that every node reaches", sorted(job.facts)))
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
            found.append(problem(ERROR, "environment", f"{name} is {listing}: set it alike on every rank (export it "
                                 "before the launcher, or in the batch script)", sorted(job.facts)))
    return found


def library_problems(job: Job) -> list[dict]:
    found = []
    for what in ("torch_mojo", "torch"):
        versions: dict[str, list[int]] = {}
        for rank, facts in job.facts.items():
            versions.setdefault(facts[what], []).append(rank)
        if len(versions) > 1:
            listing = " and ".join(f"{version} on {rank_ranges(ranks)}" for version, ranks in versions.items())
            found.append(problem(ERROR, "libraries", f"{what.replace('_', '-')} differs between ranks ({listing}): "
                                 "load the same installation on every node", sorted(job.facts)))
    broken: dict[tuple[str, str, str], list[int]] = {}
    loaded: dict[str, dict[str, list[int]]] = {}  # device: {library and version: ranks}
    for rank, facts in job.facts.items():
        for device, lookup in facts["libraries"].items():
            if lookup.get("load_error"):
                message = f"{lookup['path']} does not load: {lookup['load_error']}"
            elif not lookup["path"]:
                message = f"no library for {device} tensors ({lookup['source']}; searched " \
                          f"{', '.join(lookup['searched'])})"
            else:
                text = f"{lookup['path']} version {lookup.get('version')}"
                loaded.setdefault(device, {}).setdefault(text, []).append(rank)
                continue
            broken.setdefault((ERROR, "libraries", message), []).append(rank)
    found += grouped(broken)
    for device, choices in loaded.items():
        if len(choices) > 1:
            listing = "; ".join(f"{text} on {rank_ranges(ranks)}" for text, ranks in choices.items())
            found.append(problem(ERROR, "libraries", f"the ranks load different libraries for {device} tensors "
                                 f"({listing}): every rank must load the same one", sorted(job.facts)))
    return found


def cache_problems(job: Job, seen_by: dict[int, list[str]]) -> list[dict]:
    """The cache directory should be writable, and one that every node
    sees: `seen_by` holds, for each node's local rank 0, the nodes whose
    marker files it found there."""
    unwritable = [rank for rank, facts in job.facts.items() if not facts["cache"]["writable"]]
    if unwritable:
        path = job.facts[unwritable[0]]["cache"]["path"]
        return [problem(WARNING, "cache", f"the cache directory {path} is not writable: set "
                        "TORCH_MOJO_BACKEND_CACHE_DIR to a directory of yours on a filesystem every node mounts",
                        unwritable)]
    nodes = nodes_of(job)
    blind = [rank for rank, seen in seen_by.items() if set(seen) != set(nodes)]
    if len(nodes) < 2 or not blind:
        return []
    facts = job.facts[blind[0]]["cache"]
    return [problem(WARNING, "cache", f"the cache directory {facts['path']} is not shared between the nodes (a "
                    f"{facts['filesystem']} filesystem; {rank_ranges(blind)} do not see the other nodes' files "
                    "there): set TORCH_MOJO_BACKEND_CACHE_DIR to a directory on a filesystem every node mounts "
                    "(such as $SCRATCH/torch-mojo-cache)", blind)]


def vendor_network_problems(job: Job) -> list[dict]:
    """What RCCL/NCCL logged of their network during the measurements."""
    if not job.vendor_networks:
        return []
    on_hosts = [rank for rank, facts in job.facts.items() if facts["host"] in job.vendor_networks]
    return [problem(severity, "fabric", f"on {message}", on_hosts)
            for severity, message in nccl_log.problems(job.vendor_networks)]


def measurement_problems(job: Job) -> list[dict]:
    found = [problem(ERROR, "measurement", f"the measurements failed: {message}", [rank])
             for rank, message in job.failures.items()]
    for kind in ("within node", "between nodes"):
        links = [link for link in job.links if link["kind"] == kind]
        if len(links) < 3:
            continue
        typical = statistics.median(link["bandwidth_gbps"] for link in links)
        for link in links:
            if link["bandwidth_gbps"] < typical / 4:
                found.append(problem(
                    WARNING, "measurement", f"the link {kind} between ranks {link['a']} and {link['b']} runs at "
                    f"{link['bandwidth_gbps']:.2f} GB/s, under a quarter of the others' median ({typical:.2f} "
                    "GB/s): check that node's NIC, cabling or binding", [link["a"], link["b"]]))
    return found


def ordered(problems: list[dict]) -> list[dict]:
    return sorted(problems, key=lambda item: (item["severity"] != ERROR, KINDS.index(item["kind"]), item["ranks"][:1]))


def torchcomms_problems(job: Job) -> list[dict]:
    """With TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 torch makes every group
    through torchcomms: a torchcomms that mojo's backend was not built for
    fails init_process_group on those ranks."""
    findings = {}
    for rank, facts in job.facts.items():
        status = facts.get("torchcomms", {})
        if status.get("switch") == "1" and status.get("problem"):
            findings.setdefault((ERROR, "libraries", status["problem"]), []).append(rank)
    return grouped(findings)


def before_measurements(job: Job, timeout: float) -> list[dict]:
    """What the ranks' facts show."""
    found = [*missing_ranks(job, timeout), *reported_by_ranks(job)]
    if job.facts:
        found += [*shared_cores(job), *fabric_problems(job), *differing_settings(job), *library_problems(job),
                  *torchcomms_problems(job)]
    return ordered(found)


def measurements_possible(problems: list[dict]) -> bool:
    return not any(item["severity"] == ERROR and item["kind"] in STOPS_MEASUREMENTS for item in problems)


def after_measurements(job: Job, seen_by: dict[int, list[str]]) -> list[dict]:
    """What the measurements and the cache markers show."""
    return ordered([*cache_problems(job, seen_by), *measurement_problems(job), *vendor_network_problems(job)])
