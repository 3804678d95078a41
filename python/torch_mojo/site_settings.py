"""The settings HPC sites publish for PyTorch's collectives, by network and
GPU vendor: one table. `torch-mojo modulefile` sets them (each with its
reason as a comment), `torch-mojo doctor` checks a job's environment
against them, and docs/install.md lists them (a test compares the two).

Sources, as the sites publish them: HPE's Slingshot guide for NCCL and
RCCL (HewlettPackard/shs-ccl-docs, ccl_env.sh), OLCF's PyTorch on
Frontier, LLNL's launcher for the El Capitan family (LBANN/HPC-launcher),
CSCS's NCCL page for Alps.
"""

from __future__ import annotations

from dataclasses import dataclass

# The kinds of machine a module is written for: a network between nodes
# and a GPU vendor within them.
NETWORKS = {
    "ethernet": "Ethernet",
    "slingshot": "HPE Slingshot 11",
    "infiniband": "InfiniBand",
}
GPUS = {
    "none": "CPUs",
    "amd": "AMD GPUs (RCCL)",
    "nvidia": "NVIDIA GPUs (NCCL)",
}

# The network name the libfabric plugin (aws-ofi-nccl) gives NCCL and RCCL
# where NCCL_NET asks for it (1.14 and newer call it Libfabric otherwise),
# and that NCCL_NET selects.
PLUGIN_NETWORK = "AWS Libfabric"
# What to do where RCCL/NCCL find no such plugin (the doctor's checks, the
# modulefile's warning).
PLUGIN_ADVICE = ("load the libfabric plugin's module (aws-ofi-nccl, built for ROCm or CUDA: librccl-net.so or "
                 "libnccl-net.so) or put its lib directory on LD_LIBRARY_PATH")


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    reason: str
    source: str
    networks: tuple[str, ...] = ()  # where it applies; () for every network
    gpus: tuple[str, ...] = ()  # likewise for GPU vendors
    also_good: tuple[str, ...] = ()  # other values a site may rightly choose
    node_local: bool = False  # a directory: any on node-local disk will do
    doctor_checks: bool = True  # False: `torch-mojo doctor` checks it another way, or it is a choice

    def applies(self, network: str, gpu: str) -> bool:
        return (not self.networks or network in self.networks) and (not self.gpus or gpu in self.gpus)

    def accepts(self, value: str) -> bool:
        return value == self.value or value in self.also_good or (self.node_local and value.startswith("/"))


# How each scheduler launches a job with Slingshot's rendezvous gets off
# (the cxi driver's rdzv_get_en=0, per job), which FI_CXI_RDZV_PROTO=alt_read
# needs: without it libfabric keeps the default protocol, without a word.
# HPE's guides give Slurm's and PBS Pro's (its tuning guides spell the
# latter --disable-rdzv-get, its ccl_env.sh --disable_rdzv_get), LLNL's
# launcher Flux's.
@dataclass(frozen=True)
class Launcher:
    name: str
    option: str  # what turns rendezvous gets off
    example: str  # a launch line of 2 nodes of 4 GPUs with it


LAUNCHERS = {
    "slurm": Launcher("Slurm", "srun --network=disable_rdzv_get",
                      "srun --network=disable_rdzv_get -N 2 --ntasks-per-node=4 --gpus-per-task=1 python train.py"),
    "flux": Launcher("Flux", "flux run --setattr=rdzv_get_en=0",
                     "flux run --setattr=rdzv_get_en=0 -N 2 --tasks-per-node=4 --gpus-per-task=1 python train.py"),
    "pbs": Launcher("PBS Pro", "mpiexec --disable-rdzv-get",
                    "mpiexec --disable-rdzv-get -n 8 --ppn 4 python train.py"),
}


def rendezvous_gets_off(launcher: str | None = None) -> str:
    """How to launch with rendezvous gets off: by `launcher`, or by each."""
    chosen = [LAUNCHERS[launcher]] if launcher else LAUNCHERS.values()
    return "; ".join(f"{each.name}: `{each.option}`" for each in chosen)


SLINGSHOT_GPU = dict(networks=("slingshot",), gpus=("amd", "nvidia"))
HPE = "HPE's Slingshot guide for NCCL/RCCL"

SETTINGS: tuple[Setting, ...] = (
    # torch-mojo's own collectives between nodes.
    Setting("MOJOCCL_FABRIC_PROVIDER", "cxi", "libmojoccl between nodes over the Slingshot NIC", "torch-mojo",
            networks=("slingshot",), doctor_checks=False),
    Setting("MOJOCCL_FABRIC_PROVIDER", "verbs", "libmojoccl between nodes over the InfiniBand HCA (verbs with "
            "ofi_rxm)", "torch-mojo", networks=("infiniband",), doctor_checks=False),
    # NCCL and RCCL on Slingshot, through the libfabric plugin.
    Setting("NCCL_SOCKET_IFNAME", "hsn,hsi", "bootstrap on the Slingshot NICs, not the management Ethernet: "
            "hsn0, hsn1, ... on most machines, hsi0, ... on LLNL's (NCCL matches each prefix)",
            HPE + ", OLCF, LLNL", **SLINGSHOT_GPU,
            also_good=("hsn", "hsn0", "hsn0,hsn1", "hsn0,hsn1,hsn2,hsn3", "hsi0")),
    Setting("NCCL_NET_GDR_LEVEL", "PHB", "GPU-direct RDMA between a GPU and a NIC under the same host bridge "
            "(LLNL's 3 is the same level)", HPE + ", OLCF, LLNL, CSCS", **SLINGSHOT_GPU, also_good=("3",)),
    Setting("NCCL_CROSS_NIC", "1", "rings and trees may leave each node by another NIC: every NIC reaches the "
            "whole dragonfly", HPE + ", OLCF, LLNL, CSCS", **SLINGSHOT_GPU),
    Setting("FI_MR_CACHE_MONITOR", "userfaultfd", "libfabric's default monitor (memhooks) can miss freed GPU "
            "memory and deadlock; kdreg2 is better where the kernel module is loaded", HPE + ", OLCF, LLNL, CSCS",
            networks=("slingshot",), also_good=("kdreg2",)),
    Setting("FI_CXI_DISABLE_HOST_REGISTER", "1", "registering host memory with the GPU driver can deadlock",
            HPE + ", LLNL, CSCS", networks=("slingshot",)),
    Setting("FI_CXI_DEFAULT_CQ_SIZE", "131072", "a small completion queue overflows with many peers",
            HPE + ", OLCF, LLNL, CSCS", networks=("slingshot",)),
    Setting("FI_CXI_DEFAULT_TX_SIZE", "2048", "room for the sends NCCL's channels keep in flight (CSCS gives "
            "more, LLNL less)", HPE + ", CSCS, LLNL", **SLINGSHOT_GPU, also_good=("32768", "1024")),
    Setting("FI_CXI_RX_MATCH_MODE", "hybrid", "hardware matching that moves to software when its list fills, "
            "instead of failing (CSCS matches in software from the start)", HPE + ", LLNL, CSCS",
            networks=("slingshot",), also_good=("software",)),
    Setting("FI_CXI_RDZV_PROTO", "alt_read", "the rendezvous protocol without RDMA gets, which the job must "
            f"be launched with off ({rendezvous_gets_off()})", HPE + ", OLCF, LLNL", **SLINGSHOT_GPU),
    Setting("FI_CXI_RDZV_EAGER_SIZE", "0", "no eager data ahead of a rendezvous (alt_read)", HPE + ", LLNL",
            **SLINGSHOT_GPU),
    Setting("FI_CXI_RDZV_THRESHOLD", "0", "every message past the inject size by rendezvous (alt_read)",
            HPE + ", LLNL", **SLINGSHOT_GPU),
    Setting("FI_CXI_RDZV_GET_MIN", "0", "the rendezvous read for any size (alt_read)", HPE + ", LLNL",
            **SLINGSHOT_GPU),
    Setting("NCCL_PROTO", "^LL128", "LL128 is slower on Slingshot, and has corrupted data with GPU-direct RDMA "
            "(NVIDIA/nccl issue 2001)", "CSCS", networks=("slingshot",), gpus=("nvidia",)),
    # AMD GPUs.
    Setting("HSA_FORCE_FINE_GRAIN_PCIE", "1", "RCCL's GPU-direct RDMA needs fine-grained PCIe memory", HPE,
            networks=("slingshot", "infiniband"), gpus=("amd",)),
    Setting("MIOPEN_USER_DB_PATH", "/tmp/$USER-miopen", "MIOpen's databases on node-local disk: many ranks "
            "writing one in a shared home lock it", "OLCF", gpus=("amd",), node_local=True),
    Setting("MIOPEN_CUSTOM_CACHE_DIR", "/tmp/$USER-miopen", "MIOpen's compiled kernels beside its databases",
            "OLCF", gpus=("amd",), node_local=True),
    Setting("MODULAR_DEVICE_CONTEXT_MEMORY_MANAGER_VMM", "1", "MAX's `mojo` device holds only the memory it "
            "uses, not about 90% of an MI300A's RAM (the module's help says what it costs at exit)", "torch-mojo",
            gpus=("amd",), doctor_checks=False),
)


def for_machine(network: str, gpu: str) -> list[Setting]:
    """The settings for nodes of `network` and `gpu`, in the table's order."""
    if network not in NETWORKS:
        raise ValueError(f"unknown network {network!r}: expected one of {', '.join(NETWORKS)}")
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU vendor {gpu!r}: expected one of {', '.join(GPUS)}")
    return [setting for setting in SETTINGS if setting.applies(network, gpu)]


def machine_title(network: str, gpu: str) -> str:
    return f"{GPUS[gpu]} on {NETWORKS[network]}"


def markdown_table() -> str:
    """The table of docs/install.md."""
    lines = ["| variable | value | where | why | published by |", "|---|---|---|---|---|"]
    for setting in SETTINGS:
        where = "; ".join(filter(None, [" or ".join(NETWORKS[name] for name in setting.networks),
                                        " or ".join(GPUS[name] for name in setting.gpus)])) or "everywhere"
        value = f"`{setting.value}`" + "".join(f" or `{other}`" for other in setting.also_good)
        value += " (any node-local directory)" if setting.node_local else ""
        reason = setting.reason.replace("|", "\\|")
        lines.append(f"| `{setting.name}` | {value} | {where} | {reason} | {setting.source} |")
    return "\n".join(lines) + "\n"
