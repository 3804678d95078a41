"""What one rank of a job knows about itself: where it runs, the cores it
may use, its device, the collective libraries it would load, the
transports it would use within and between nodes, its environment (and
what is wrong with it), and its cache directory. Nothing here talks to
other ranks or initialises a process group."""

from __future__ import annotations

import os
import socket

from torch_mojo import __version__, fabric_info, launcher, libraries, torchcomms
from torch_mojo.doctor import variables
from torch_mojo.doctor.filesystems import SHARED_FILESYSTEMS, filesystem_of
from torch_mojo.fabric_info import HARDWARE_PROVIDERS



def node_identity() -> str:
    """The node as libmojoccl groups ranks into nodes (cpp/ccl/base/bootstrap.cc):
    MOJOCCL_HOSTID, else the host name and the kernel's boot id."""
    configured = os.environ.get("MOJOCCL_HOSTID")
    if configured:
        return configured
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot_id = file.read().strip()
    except OSError:
        boot_id = ""
    return f"{socket.gethostname()}/{boot_id}"


def number_ranges(numbers) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (cores, ranks)."""
    ranges = []
    for number in sorted(numbers):
        if ranges and number == ranges[-1][1] + 1:
            ranges[-1][1] = number
        else:
            ranges.append([number, number])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in ranges)


def cache_facts() -> dict:
    from torch_mojo.env import cache_dir

    path = cache_dir()
    existing = path
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    kind = filesystem_of(existing)
    return {"path": path, "exists": os.path.isdir(path), "writable": os.access(existing, os.W_OK),
            "filesystem": kind, "shared_filesystem": kind in SHARED_FILESYSTEMS}


def device_facts() -> dict:
    """This rank's device, chosen as a training script chooses it, and the
    libraries for its tensors (what a failure leaves of them, and why)."""
    from torch_mojo.distributed import use_local_rank_gpu

    facts = {"device": "cpu", "libraries": {"cpu": libraries.with_version(libraries.find_mojoccl())}}
    try:
        use_local_rank_gpu()
        accelerator = libraries.current_accelerator()
        if accelerator:
            lookup, kind = libraries.accelerator_lookup(accelerator.type)
            facts.update(device=str(accelerator), accelerator_library_kind=kind)
            facts["libraries"][accelerator.type] = libraries.with_version(lookup)
    except (RuntimeError, ValueError) as error:
        facts.update(device="unusable", device_error=str(error))
    return facts


def describe_fabric(local_rank: int) -> tuple[str | None, str | None]:
    """(what libmojoccl would open between nodes for the node's
    `local_rank`th rank, or why it cannot): asked of libmojoccl itself,
    which chooses the provider and domain."""
    from torch_mojo.mojoccl import CclError, Library

    try:
        library = Library()
    except (OSError, AttributeError) as error:
        return None, f"this libmojoccl cannot say (reinstall torch-mojo): {error}"
    try:
        return library.describe_fabric(local_rank), None
    except CclError as error:
        return None, error.message


def fabric_facts(local_rank: int) -> tuple[dict, dict[str, int]]:
    """What this rank, the node's `local_rank`th, would use between nodes,
    and the parameters (with their types) its libfabric declares."""
    lookup = libraries.find_libfabric()
    facts = {"library": lookup.path, "source": lookup.source, "version": None, "providers": [], "hardware": []}
    parameters = {}
    if lookup.path:
        try:
            details = fabric_info.libfabric_details(lookup.path)
            parameters = variables.libfabric_parameters(lookup.path)
        except OSError as error:
            details = {"version": None, "providers": []}
            facts["load_error"] = str(error)
        facts.update(version=details["version"], providers=details["providers"])
        facts["hardware"] = sorted({name.split(";")[0] for name in details["providers"]
                                    if name.split(";")[0] in HARDWARE_PROVIDERS})
    choice = fabric_info.fabric_provider_choice(facts["providers"])
    facts["provider"], facts["provider_source"] = choice["provider"], choice["source"]
    if lookup.path and "load_error" not in facts:
        facts["in_use"], facts["failure"] = describe_fabric(local_rank)
    else:
        where = facts.get("load_error") or f"{lookup.source}; searched {', '.join(lookup.searched)}"
        facts["in_use"], facts["failure"] = None, f"libfabric.so.1 is not usable ({where}): install libfabric, " \
            "or set MOJOCCL_LIBFABRIC to the site's libfabric.so.1"
    return facts, parameters


def environment_of_interest(environ) -> dict[str, str]:
    """The variables that shape collectives: ours, NCCL's and libfabric's
    (and the Slingshot VNIs Slurm gives a job, which libfabric's cxi uses)."""
    from torch_mojo.env import PREFIXES, shown_value

    return {name: shown_value(name, value) for name, value in sorted(environ.items())
            if name.startswith(PREFIXES + ("NCCL_", "RCCL_", "OFI_NCCL_", "FI_", "HSA_", "MIOPEN_", "TORCH_NCCL_",
                                           "TORCH_FR_", "SLINGSHOT_"))}


def gather() -> dict:
    """Everything this rank reports, as JSON-ready data."""
    import torch

    environ = dict(os.environ)
    facts = {
        "rank": int(environ.get("RANK", 0)), "local_rank": int(environ.get("LOCAL_RANK", 0)),
        "world_size": int(environ.get("WORLD_SIZE", 1)), "launcher": launcher.launcher() or "none",
        "host": socket.gethostname(), "node": node_identity(), "pid": os.getpid(),
        "cpus": sorted(os.sched_getaffinity(0)), "online_cpus": os.cpu_count(),
        "torch_mojo": __version__, "torch": torch.__version__,
        "bootstrap_interface": environ.get("MOJOCCL_SOCKET_IFNAME") or "auto",
        "environment": environment_of_interest(environ), "cache": cache_facts(),
        "torchcomms": torchcomms.status(),
    }
    facts.update(device_facts())
    fabric, parameters = fabric_facts(facts["local_rank"])
    facts["fabric"] = fabric
    kind = gpu_library_kind(facts)
    facts["machine"] = {"network": network_of(fabric), "gpu": {"rccl": "amd", "nccl": "nvidia"}.get(kind, "none")}
    if kind:
        facts["net_plugin"] = libraries.find_net_plugin(kind).to_dict()
    facts["problems"] = [
        *variables.review_ours(environ),
        *variables.review_nccl(environ, nccl_library(facts)),
        *variables.review_libfabric(environ, parameters),
        *variables.review_site_settings(environ, **facts["machine"]),
        *variables.review_rendezvous_gets(environ),
        *variables.review_net_plugin(environ, kind),
        *variables.review_socket_interface(environ),
    ]
    return facts


def network_of(fabric: dict) -> str:
    """slingshot where cxi is chosen (by the user, or by `auto` beside a cxi
    NIC); infiniband beside an InfiniBand HCA; else ethernet."""
    if fabric["provider"] == "cxi":
        return "slingshot"
    return "infiniband" if "verbs" in fabric["hardware"] else "ethernet"


def gpu_library_kind(facts: dict) -> str | None:
    """rccl or nccl: the vendor library this rank's GPU tensors go to (the
    one NCCL_* variables and the network plugin are for), or None."""
    kind = facts.get("accelerator_library_kind")
    return kind if kind in ("nccl", "rccl") else None


def nccl_library(facts: dict) -> str | None:
    """The NCCL or RCCL library whose variables matter: the one this rank's
    accelerator loads, else the one a GPU job here would load."""
    if facts.get("accelerator_library_kind") in ("nccl", "rccl"):
        return next(lookup["path"] for device, lookup in facts["libraries"].items() if device != "cpu")
    return libraries.find_nccl().path or libraries.find_rccl().path
