"""`torch-mojo doctor --nccl-log FILE...`: which network RCCL or NCCL used
between nodes, read from their NCCL_DEBUG=INFO output (one file per rank
with NCCL_DEBUG_FILE, or a job's combined output).

NCCL and RCCL print every line as `host:pid:tid [device] NCCL INFO ...`,
which a job's log may prefix: `0: ` (srun -l, flux run -l), `[default0]:`
(torchrun --tee), `[1,0]<stdout>:` (mpirun --tag-output), or a timestamp
(NCCL_DEBUG_TIMESTAMP_LEVELS=INFO, in any NCCL_DEBUG_TIMESTAMP_FORMAT).
The lines read here (NCCL_DEBUG_SUBSYS=INIT,NET prints them all):

    NET/Plugin: Could not find: libnccl-net.so            no plugin (NCCL 2.23+)
    NET/Plugin: No plugin found (libnccl-net.so)          no plugin (NCCL 2.21, 2.22)
    NET/Plugin : dlerror=... No plugin found (...), ...   no plugin (NCCL 2.19, 2.20)
    NET/Plugin : Plugin load (libnccl-net.so) returned 2  no plugin (NCCL 2.18)
    NET/Plugin : No plugin found (librccl-net.so), ...    no plugin (RCCL)
    NET/Plugin: Loaded net plugin AWS Libfabric (v9)      a plugin
    NET/OFI Selected Provider is cxi (found 4 nics)       the plugin's libfabric provider
    NET/IB : Using [0]mlx5_0:1/IB ...                     NCCL's InfiniBand transport
    Using network Socket | IB | AWS Libfabric             the network chosen
    comm 0x... rank 0 nRanks 8 nNodes 2 localRanks 4 ...  the communicator's span
    Channel 00/0 : 0[0] -> 4[0] [send] via NET/IB/0/GDRDMA   traffic between nodes
    Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/1(0)/GDRDMA  the same through a peer's NIC (PXN)

A socket network between nodes is an error (the plugin did not load);
a network without GPU-direct RDMA between nodes, or a plugin on a socket
provider, a warning.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from torch_mojo.doctor.variables import ERROR, WARNING
from torch_mojo.fabric_info import SOCKET_PROVIDERS
from torch_mojo.site_settings import PLUGIN_ADVICE, PLUGIN_NETWORK

# Anywhere in the line: what a launcher or a timestamp puts before it is
# skipped (a host name holds none of the characters they end with).
LINE = re.compile(r"(?:^|(?<=[\s:\]>]))(?P<host>[^\s:\[\]<>]+):(?P<pid>\d+):\d+ \[\d+\] NCCL INFO "
                  r"(?P<message>.*)$")
NO_PLUGIN = re.compile(r"NET/Plugin ?: (?:Could not find: ?(?P<nccl>.+?)\.?(?: Using .*)?$|"
                       r"(?:dlerror=.*? )?No plugin found \((?P<rccl>[^)]+)\)|"
                       r"Plugin load \((?P<old>[^)]+)\) returned 2 : (?P=old): )")
# The plugin is there but does not load (a library it needs is missing, a
# symbol is undefined): every NCCL words dlopen's message its own way.
PLUGIN_FAILED = re.compile(r"NET/Plugin ?: (?:Plugin load (?:\([^)]*\) )?returned \d+ : )?"
                           r"(?P<detail>.*(?:cannot open shared object file|undefined symbol|wrong ELF class|"
                           r"version `).*?)\.?$")
PLUGIN_LOADED = re.compile(r"NET/Plugin ?: Loaded net plugin (?P<name>.+?) \(v\d+\)")
PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<provider>[\w;]+)")
NETWORK = re.compile(r"^Using network (?P<network>.+?)\s*$")
SPAN = re.compile(r"\brank (?P<rank>\d+) nRanks (?P<ranks>\d+) nNodes (?P<nodes>\d+)")
# NET/<network>/<NIC>, with (<proxy rank>) where a peer's NIC carries it (PXN).
CHANNEL = re.compile(r"\bvia NET/(?P<network>[^/]+)/\d+(?:\(\d+\))?(?P<gdr>/GDRDMA)?")
UNREAD_KEPT = 3  # lines shown where a log does not say what was expected
# What says which network was used, for a log that lacks it.
EXPECTED = '"Using network <name>" or "Channel ... via NET/<name>/..." (NCCL_DEBUG_SUBSYS=INIT,NET prints them)'
HOW_TO_LOG = ("run the job with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET (and NCCL_DEBUG_FILE=<dir>/nccl.%h.%p "
              "for a file per rank)")


@dataclass
class HostLog:
    """What one host's lines say (every process of the host together)."""

    host: str
    processes: set[str] = field(default_factory=set)
    networks: set[str] = field(default_factory=set)
    missing_plugin: str | None = None  # the plugin file NCCL/RCCL looked for and did not find
    plugin_failed: str | None = None  # why a plugin that is there did not load
    plugin: str | None = None
    providers: set[str] = field(default_factory=set)
    nodes: int = 0  # the largest communicator's span, 0 when no line gave it
    between_nodes: dict[str, bool] = field(default_factory=dict)  # network: every channel had GPU-direct RDMA
    unread: list[str] = field(default_factory=list)  # the first messages none of the patterns read


def log_here(directory: str) -> str:
    """Makes this process's RCCL/NCCL log its network choice (INFO lines
    of INIT and NET) to a file of its own in `directory`; returns the
    file's name. Before the library first initialises."""
    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET",
                      NCCL_DEBUG_FILE=os.path.join(directory, "nccl.%h.%p"))
    return os.path.join(directory, f"nccl.{os.uname().nodename}.{os.getpid()}")


def to_json(log: HostLog) -> dict:
    return {name: sorted(value) if isinstance(value, set) else value
            for name, value in dataclasses.asdict(log).items()}


def merged(posted: list[dict]) -> dict[str, HostLog]:
    """Host logs posted by ranks (to_json's form), one per host."""
    hosts: dict[str, HostLog] = {}
    for item in posted:
        log = hosts.setdefault(item["host"], HostLog(item["host"]))
        for name in ("processes", "networks", "providers"):
            getattr(log, name).update(item[name])
        log.missing_plugin = log.missing_plugin or item["missing_plugin"]
        log.plugin_failed = log.plugin_failed or item["plugin_failed"]
        log.unread = (log.unread + item["unread"])[:UNREAD_KEPT]
        log.plugin = log.plugin or item["plugin"]
        log.nodes = max(log.nodes, item["nodes"])
        for network, direct in item["between_nodes"].items():
            log.between_nodes[network] = log.between_nodes.get(network, True) and direct
    return hosts


def read(paths: list[str]) -> dict[str, HostLog]:
    """{host: what its lines say}, from every file."""
    hosts: dict[str, HostLog] = {}
    for path in paths:
        with open(path, errors="replace") as file:
            for line in file:
                match = LINE.search(line.rstrip("\n"))
                if match:
                    log = hosts.setdefault(match["host"], HostLog(match["host"]))
                    log.processes.add(match["pid"])
                    if not note(log, match["message"].rstrip()) and len(log.unread) < UNREAD_KEPT:
                        log.unread.append(match["message"].rstrip())
    return hosts


def first_lines(paths: list[str], count: int = UNREAD_KEPT) -> list[str]:
    """The first non-empty lines of the files: what a log that holds no
    NCCL INFO line holds instead."""
    found = []
    for path in paths:
        with open(path, errors="replace") as file:
            found += [line.rstrip() for line, _ in zip(filter(str.strip, file), range(count - len(found)))]
    return found


def note(log: HostLog, message: str) -> bool:
    """Records what `message` says in `log`; False when it says nothing
    read here."""
    if found := NO_PLUGIN.search(message):
        log.missing_plugin = found["nccl"] or found["rccl"] or found["old"]
    elif found := PLUGIN_FAILED.search(message):
        log.plugin_failed = found["detail"]
    elif found := PLUGIN_LOADED.search(message):
        log.plugin = found["name"]
    elif found := PROVIDER.search(message):
        log.providers.add(found["provider"])
    elif found := NETWORK.match(message):
        log.networks.add(found["network"])
    elif found := SPAN.search(message):
        log.nodes = max(log.nodes, int(found["nodes"]))
    elif found := CHANNEL.search(message):
        network = found["network"]
        log.between_nodes[network] = log.between_nodes.get(network, True) and bool(found["gdr"])
    else:
        return False
    return True


def spans_nodes(log: HostLog, hosts: int) -> bool:
    """Whether the host's communicators reach other nodes: their span, or
    traffic over the network, or other hosts in the same logs."""
    return log.nodes > 1 or bool(log.between_nodes) or (log.nodes == 0 and hosts > 1)


def problems(hosts: dict[str, HostLog]) -> list[tuple[str, str]]:
    """(severity, message) for the hosts' networks, one per finding, naming
    every host it was found on."""
    found: dict[tuple[str, str], list[str]] = {}
    for log in sorted(hosts.values(), key=lambda log: log.host):
        for severity, message in host_problems(log, len(hosts)):
            found.setdefault((severity, message), []).append(log.host)
    return [(severity, f"{', '.join(names)}: {message}") for (severity, message), names in found.items()]


def host_problems(log: HostLog, hosts: int) -> list[tuple[str, str]]:
    """What one host's lines show; `hosts`: how many hosts the logs hold."""
    if not log.networks and not log.between_nodes:
        shown = "; its first other lines: " + " | ".join(log.unread) if log.unread else ""
        return [(ERROR, f"no line says which network NCCL/RCCL chose (expected {EXPECTED}){shown}: {HOW_TO_LOG}")]
    if not spans_nodes(log, hosts):
        return []
    if "Socket" in log.networks | set(log.between_nodes):
        looked = (f"; its plugin did not load: {log.plugin_failed}" if log.plugin_failed else
                  f"; it looked for {log.missing_plugin} and did not find it" if log.missing_plugin else "")
        fix = ("make what it names loadable where the job runs (the libfabric module loaded, its lib "
               "directory on LD_LIBRARY_PATH, or bound into the container)" if log.plugin_failed else PLUGIN_ADVICE)
        return [(ERROR, f"NCCL/RCCL used sockets between nodes (\"Using network Socket\"{looked}): the job runs "
                 f"many times slower than it should: {fix}, and set NCCL_NET=\"{PLUGIN_NETWORK}\" so "
                 "that a missing plugin fails at init instead of crawling; on InfiniBand, check that "
                 "NCCL_IB_DISABLE is unset and NCCL_IB_HCA names the HCAs")]
    found = []
    socket_providers = sorted(provider for provider in log.providers if provider.split(";")[0] in SOCKET_PROVIDERS)
    if socket_providers:
        found.append((WARNING, f"the libfabric plugin runs over {', '.join(socket_providers)}, a socket provider: "
                      "on Slingshot set FI_PROVIDER=cxi (or unset a FI_PROVIDER that names another)"))
    for network, direct in sorted(log.between_nodes.items()):
        if not direct:
            found.append((WARNING, f"{network} carries data between nodes without GPU-direct RDMA (no GDRDMA on "
                          "its channels): it is staged through host memory. Check that the GPU's peer-memory "
                          "driver is loaded (nvidia-peermem, or amdgpu's), and NCCL_NET_GDR_LEVEL (PHB on "
                          "Slingshot)"))
    return found


def summary(log: HostLog, hosts: int) -> dict:
    networks = sorted(log.networks | set(log.between_nodes))
    return {
        "host": log.host, "processes": len(log.processes), "networks": networks,
        "plugin": log.plugin, "providers": sorted(log.providers),
        "nodes": log.nodes or (hosts if spans_nodes(log, hosts) else 1),
        "gpu_direct": {network: direct for network, direct in sorted(log.between_nodes.items())},
    }


def report_lines(hosts: dict[str, HostLog], found: list[tuple[str, str]]) -> list[str]:
    lines = [*table_lines(hosts), "", *(f"{severity}: {message}" for severity, message in found)]
    errors = sum(severity == ERROR for severity, _ in found)
    lines.append(f"{errors} error{'s' * (errors != 1)}, {len(found) - errors} "
                 f"warning{'s' * (len(found) - errors != 1)}")
    return lines


def table_lines(hosts: dict[str, HostLog]) -> list[str]:
    rows = [("host", "processes", "nodes", "network", "provider", "GPU-direct between nodes")]
    for log in sorted(hosts.values(), key=lambda log: log.host):
        facts = summary(log, len(hosts))
        direct = ", ".join(f"{network}: {'yes' if on else 'no'}" for network, on in facts["gpu_direct"].items())
        rows.append((facts["host"], str(facts["processes"]), str(facts["nodes"]),
                     ", ".join(facts["networks"]) or "?", ", ".join(facts["providers"]) or "-", direct or "-"))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]

