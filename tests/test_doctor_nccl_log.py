"""`torch-mojo doctor --nccl-log`: the network RCCL/NCCL used between
nodes, read from NCCL_DEBUG=INFO logs written in the forms NCCL and RCCL
print (their `host:pid:tid [device] NCCL INFO` prefix and messages), as
files of their own and as jobs save them (srun -l, torchrun --tee, mpirun
--tag-output, timestamps)."""

import json
import subprocess
import sys

import pytest

from torch_mojo import site_settings

# Two MI300A nodes, RCCL without its plugin: the socket fallback.
RCCL_SOCKETS = """\
nid001:4101:4101 [0] NCCL INFO RCCL version : 2.27.7-HEAD:7c12ead
nid001:4101:4101 [0] NCCL INFO NET/Plugin : No plugin found (librccl-net.so), using internal implementation
nid001:4101:4101 [0] NCCL INFO NET/Socket : Using [0]hsn0:10.100.0.11<0> [1]hsn1:10.100.1.11<0>
nid001:4101:4101 [0] NCCL INFO Using network Socket
nid001:4101:4101 [0] NCCL INFO comm 0x5604e8a0 rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0 MNNVL 0
nid001:4101:4180 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/Socket/0
nid002:5202:5202 [0] NCCL INFO NET/Plugin : No plugin found (librccl-net.so), using internal implementation
nid002:5202:5202 [0] NCCL INFO Using network Socket
nid002:5202:5202 [0] NCCL INFO comm 0x55c1f2a0 rank 4 nRanks 8 nNodes 2 localRanks 4 localRank 0 MNNVL 0
nid002:5202:5281 [0] NCCL INFO Channel 00/0 : 7[3] -> 0[0] [send] via NET/Socket/1
"""

# The same job with aws-ofi-nccl over cxi, GPU-direct RDMA on.
RCCL_LIBFABRIC = """\
nid001:4101:4101 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v9)
nid001:4101:4101 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
nid001:4101:4101 [0] NCCL INFO Using network AWS Libfabric
nid001:4101:4101 [0] NCCL INFO comm 0x5604e8a0 rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0 MNNVL 0
nid001:4101:4180 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/AWS Libfabric/0/GDRDMA
nid002:5202:5202 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v9)
nid002:5202:5202 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
nid002:5202:5202 [0] NCCL INFO Using network AWS Libfabric
nid002:5202:5281 [0] NCCL INFO Channel 00/0 : 7[3] -> 0[0] [send] via NET/AWS Libfabric/1/GDRDMA
"""

# H100 nodes on InfiniBand: NCCL's own transport, with and without GDRDMA.
NCCL_IB = """\
gpu17:881:881 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
gpu17:881:881 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.17<0>
gpu17:881:881 [0] NCCL INFO Using network IB
gpu17:881:881 [0] NCCL INFO comm 0x7f3e10 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
gpu17:881:960 [0] NCCL INFO Channel 00/0 : 15[7] -> 0[0] [receive] via NET/IB/0/GDRDMA
gpu18:772:772 [0] NCCL INFO Using network IB
gpu18:772:850 [0] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [receive] via NET/IB/0{gdr}
"""

ONE_NODE = """\
ws:300:300 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
ws:300:300 [0] NCCL INFO Using network Socket
ws:300:300 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
ws:300:390 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC
"""

PLUGIN_ON_TCP = RCCL_LIBFABRIC.replace("Provider is cxi (found 4 nics)", "Provider is tcp;ofi_rxm (found 1 nics)")


def doctor(tmp_path, *logs, as_json=False):
    paths = []
    for index, text in enumerate(logs):
        path = tmp_path / f"nccl.{index}.log"
        path.write_text(text)
        paths.append(str(path))
    command = [sys.executable, "-m", "torch_mojo.cli", "doctor", "--nccl-log", *paths] + (["--json"] if as_json else [])
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_socket_fallback_between_nodes_is_an_error_with_the_fix(tmp_path):
    result = doctor(tmp_path, RCCL_SOCKETS)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["host", "processes", "nodes", "network", "provider", "GPU-direct", "between",
                                "nodes"]
    assert lines[1].split() == ["nid001", "1", "2", "Socket", "-", "Socket:", "no"]
    assert 'error: nid001, nid002: NCCL/RCCL used sockets between nodes ("Using network Socket"; it looked ' \
           'for librccl-net.so and did not find it)' in result.stdout
    assert "aws-ofi-nccl, built for ROCm or CUDA" in result.stdout and 'NCCL_NET="AWS Libfabric"' in result.stdout
    assert result.stdout.rstrip().endswith("1 error, 0 warnings")


def test_the_libfabric_plugin_with_gpu_direct_passes(tmp_path):
    result = doctor(tmp_path, RCCL_LIBFABRIC, as_json=True)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["problems"] == [] and report["status"] == 0
    first = next(host for host in report["hosts"] if host["host"] == "nid001")
    assert first == {"host": "nid001", "processes": 1, "networks": ["AWS Libfabric"], "plugin": "AWS Libfabric",
                     "providers": ["cxi"], "nodes": 2, "gpu_direct": {"AWS Libfabric": True}}


@pytest.mark.parametrize("gdr, status", [("/GDRDMA", 0), ("", 0)])
def test_infiniband_passes_and_without_gpu_direct_warns(tmp_path, gdr, status):
    # One log per rank: the hosts' lines come from separate files.
    first, second = NCCL_IB.format(gdr=gdr).split("gpu18:772:772", 1)
    result = doctor(tmp_path, first, "gpu18:772:772" + second)
    assert result.returncode == status, result.stdout + result.stderr
    warned = "warning: gpu18: IB carries data between nodes without GPU-direct RDMA" in result.stdout
    assert warned == (gdr == ""), result.stdout
    assert "gpu17" in result.stdout and "error" not in result.stdout.replace("0 errors", "")


# Each NCCL's wording of a plugin it did not find (from NCCL's net.cc and
# plugin_open.cc of each release, and RCCL's), and of one it found but
# could not load.
NOT_FOUND = [
    ("NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open shared object file: No "
     "such file or directory", "libnccl-net.so"),  # NCCL 2.18
    ("NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin "
     "found (libnccl-net.so), using internal implementation", "libnccl-net.so"),  # NCCL 2.19, 2.20
    ("NET/Plugin: No plugin found (libnccl-net.so)", "libnccl-net.so"),  # NCCL 2.21, 2.22
    ("NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.", "libnccl-net.so"),  # 2.23-2.25
    ("NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.", "libnccl-net.so"),  # 2.26, 2.27
    ("NET/Plugin: Could not find: libnccl-net.so", "libnccl-net.so"),  # NCCL 2.28: no fallback text
    ("NET/Plugin: Could not find: ofi libnccl-net-ofi.so.", "ofi libnccl-net-ofi.so"),  # NCCL_NET_PLUGIN=ofi
    ("NET/Plugin : No plugin found (librccl-net.so), using internal implementation", "librccl-net.so"),  # RCCL
]
NOT_LOADED = [
    ("NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libfabric.so.1: cannot open shared object file: No "
     "such file or directory", "libfabric.so.1: cannot open shared object file: No such file or directory"),
    ("NET/Plugin: Plugin load returned 2 : libfabric.so.1: cannot open shared object file: No such file or "
     "directory when loading libnccl-net.so", "libfabric.so.1: cannot open shared object file: No such file or "
     "directory when loading libnccl-net.so"),  # NCCL 2.21
    ("NET/Plugin: libnccl-net.so: /sw/ofi/lib/libnccl-net.so: undefined symbol: fi_getinfo",
     "libnccl-net.so: /sw/ofi/lib/libnccl-net.so: undefined symbol: fi_getinfo"),  # NCCL 2.28
]


@pytest.mark.parametrize("line, looked_for", NOT_FOUND)
def test_the_plugin_files_looked_for_are_read_in_every_form(line, looked_for):
    from torch_mojo.doctor import nccl_log

    log = nccl_log.HostLog("n1")
    assert nccl_log.note(log, line)
    assert log.missing_plugin == looked_for and log.plugin_failed is None, line


@pytest.mark.parametrize("line, detail", NOT_LOADED)
def test_a_plugin_that_does_not_load_is_told_apart(tmp_path, line, detail):
    from torch_mojo.doctor import nccl_log

    log = nccl_log.HostLog("n1")
    assert nccl_log.note(log, line)
    assert log.plugin_failed == detail and log.missing_plugin is None, line
    # Then the error says why the plugin was not used.
    result = doctor(tmp_path, RCCL_SOCKETS.replace(NOT_FOUND[-1][0], line))
    assert result.returncode == 1 and f"its plugin did not load: {detail}" in result.stdout, result.stdout


# ---------------------------------------------- logs as jobs save them

def saved_by(form: str, text: str) -> str:
    """`text` as a job's log keeps it: each line prefixed by its rank
    (srun -l, flux run -l), its torchrun worker (--tee), Open MPI's tag,
    or a timestamp (NCCL_DEBUG_TIMESTAMP_LEVELS=INFO, default and custom
    formats)."""
    prefixes = {
        "srun -l": lambda rank: f"{rank}: ",
        "torchrun --tee": lambda rank: f"[default{rank}]:",
        "mpirun --tag-output": lambda rank: f"[1,{rank}]<stdout>:",
        "timestamps": lambda rank: "[2026-12-06 10:00:0%d] " % rank,
        "timestamps with microseconds": lambda rank: "10:00:0%d.123456 " % rank,
        "srun -l and timestamps": lambda rank: f"{rank}: [2026-12-06 10:00:00] ",
    }
    return "".join(prefixes[form](index % 2) + line for index, line in enumerate(text.splitlines(keepends=True)))


SAVED_FORMS = ["srun -l", "torchrun --tee", "mpirun --tag-output", "timestamps", "timestamps with microseconds",
               "srun -l and timestamps"]


@pytest.mark.parametrize("form", SAVED_FORMS)
def test_logs_saved_by_launchers_and_with_timestamps_are_read(tmp_path, form):
    plain = json.loads(doctor(tmp_path, RCCL_LIBFABRIC, as_json=True).stdout)
    saved = doctor(tmp_path, saved_by(form, RCCL_LIBFABRIC), as_json=True)
    assert saved.returncode == 0 and json.loads(saved.stdout) == plain, saved.stdout
    fallback = doctor(tmp_path, saved_by(form, RCCL_SOCKETS))
    assert fallback.returncode == 1 and "error: nid001, nid002: NCCL/RCCL used sockets between nodes" in \
        fallback.stdout, fallback.stdout


# H100 nodes whose rings leave each node by a peer GPU's NIC (PXN, on by
# default): `via NET/IB/<NIC>(<proxy rank>)`.
NCCL_PXN = """\
gpu17:881:881 [0] NCCL INFO Using network IB
gpu17:881:881 [0] NCCL INFO comm 0x7f3e10 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
gpu17:881:960 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/1(1){gdr}
gpu17:881:960 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/3(3){gdr}/Shared
"""


@pytest.mark.parametrize("gdr", ["/GDRDMA", "/GDRDMA(PCI)", ""])
def test_pxn_channels_are_read_with_their_proxy(tmp_path, gdr):
    result = doctor(tmp_path, NCCL_PXN.format(gdr=gdr), as_json=True)
    report = json.loads(result.stdout)
    assert report["hosts"][0]["gpu_direct"] == {"IB": bool(gdr)}, result.stdout
    assert bool(report["problems"]) == (gdr == ""), report["problems"]


def test_sockets_within_one_node_are_fine_and_a_plugin_on_tcp_warns(tmp_path):
    alone = doctor(tmp_path, ONE_NODE)
    assert alone.returncode == 0 and alone.stdout.rstrip().endswith("0 errors, 0 warnings"), alone.stdout
    tcp = doctor(tmp_path, PLUGIN_ON_TCP)
    assert tcp.returncode == 0 and "runs over tcp;ofi_rxm, a socket provider" in tcp.stdout, tcp.stdout


def test_a_log_without_the_network_lines_says_what_it_expected_and_what_it_read(tmp_path):
    nothing = doctor(tmp_path, "epoch 1 loss 0.3\nepoch 2 loss 0.2\n")
    assert nothing.returncode == 1 and "no NCCL INFO lines" in nothing.stdout
    assert "expected lines of the form `host:pid:tid [device] NCCL INFO message`" in nothing.stdout
    assert nothing.stdout.rstrip().endswith("The first lines read:\n    epoch 1 loss 0.3\n    epoch 2 loss 0.2")
    version_only = doctor(tmp_path, "n1:1:1 [0] NCCL INFO NCCL version 2.27.7+cuda12.9\n")
    assert version_only.returncode == 1
    assert "error: n1: no line says which network NCCL/RCCL chose (expected \"Using network <name>\" or " \
           "\"Channel ... via NET/<name>/...\"" in version_only.stdout
    assert "its first other lines: NCCL version 2.27.7+cuda12.9: run the job with NCCL_DEBUG=INFO" in \
        version_only.stdout
    missing = subprocess.run([sys.executable, "-m", "torch_mojo.cli", "doctor", "--nccl-log", str(tmp_path / "no")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "No such file" in missing.stderr


# ------------------------------------------------ before a job: the preflight

def test_nccl_net_without_its_plugin_is_an_error_and_with_it_passes(tmp_path):
    from torch_mojo.doctor.variables import ERROR, WARNING, review_net_plugin

    plugin = tmp_path / "librccl-net.so"
    plugin.write_bytes(b"\0OFI_NCCL_PROTOCOL\0OFI_NCCL_GDR_FLUSH_DISABLE\0")
    alone = {"LD_LIBRARY_PATH": "", "NCCL_NET": "AWS Libfabric"}
    [(severity, message)] = review_net_plugin(alone, "rccl")
    assert severity == ERROR and message.startswith("NCCL_NET=AWS Libfabric asks for a plugin's network and no "
                                                    "plugin is found (librccl-net.so on the library path)")
    assert review_net_plugin({**alone, "NCCL_NET": "IB"}, "nccl") == []  # NCCL's own network
    assert review_net_plugin({**alone, "LD_LIBRARY_PATH": str(tmp_path)}, "rccl") == []
    # A plugin named with NCCL_NET_PLUGIN: the name itself, then librccl-net-NAME.so.
    [(severity, message)] = review_net_plugin({"LD_LIBRARY_PATH": str(tmp_path), "NCCL_NET_PLUGIN": "ofi"}, "rccl")
    assert severity == ERROR and "NCCL_NET_PLUGIN=ofi names a plugin that is not found" in message
    (tmp_path / "librccl-net-ofi.so").write_bytes(plugin.read_bytes())
    assert review_net_plugin({"LD_LIBRARY_PATH": str(tmp_path), "NCCL_NET_PLUGIN": "ofi"}, "rccl") == []
    # Both: the file by its suffix, the network so that init fails without it.
    both = review_net_plugin({"LD_LIBRARY_PATH": str(tmp_path), "NCCL_NET_PLUGIN": "ofi", "NCCL_NET": "AWS Libfabric",
                              "OFI_NCCL_GDR_FLUSH_DISABEL": "1"}, "rccl")
    assert [severity for severity, _ in both] == [WARNING]
    assert both[0][1].startswith("OFI_NCCL_GDR_FLUSH_DISABEL is not a variable librccl-net-ofi.so reads") \
        and "OFI_NCCL_GDR_FLUSH_DISABLE?" in both[0][1]
    # No GPU library here and nothing asked of a plugin: nothing to say.
    assert review_net_plugin({}, None) == []


def test_nccl_socket_ifname_is_read_as_nccl_reads_it():
    import socket

    from torch_mojo.doctor.variables import interface_matches, review_socket_interface

    names = ["lo", "eth0", "hsn0", "hsn1"]
    assert interface_matches("hsn", names) == ["hsn0", "hsn1"]
    assert interface_matches("=hsn", names) == [] and interface_matches("=hsn1,eth0", names) == ["eth0", "hsn1"]
    assert interface_matches("^lo,eth", names) == ["hsn0", "hsn1"]
    here = [name for _, name in socket.if_nameindex()]
    assert review_socket_interface({"NCCL_SOCKET_IFNAME": here[0]}) == []
    [(severity, message)] = review_socket_interface({"NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3"})
    assert severity == "error" and message.startswith("NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3 matches none of this "
                                                      f"node's interfaces ({', '.join(here)})")


def test_the_published_settings_are_checked_for_the_nodes_network_and_gpus(tmp_path):
    from torch_mojo.doctor.variables import review_site_settings

    published = {setting.name: setting.value.replace("$USER", "u")
                 for setting in site_settings.for_machine("slingshot", "amd")}
    assert review_site_settings(published, "slingshot", "amd") == []
    missing = review_site_settings({**published, "FI_CXI_RDZV_PROTO": "default"}, "slingshot", "amd")
    assert [message.split(":")[0] for _, message in missing] == ["FI_CXI_RDZV_PROTO is default"]
    assert "`torch-mojo modulefile --network slingshot --gpu amd` sets it" in missing[0][1]
    # Other values sites rightly choose, and any node-local directory for MIOpen.
    chosen = {**published, "FI_MR_CACHE_MONITOR": "kdreg2", "NCCL_NET_GDR_LEVEL": "3",
              "MIOPEN_USER_DB_PATH": str(tmp_path)}
    assert review_site_settings(chosen, "slingshot", "amd") == []
    assert review_site_settings({}, "ethernet", "none") == []


# What each site publishes for GPUs on Slingshot, as it publishes it:
# HPE's ccl_env.sh (shs-ccl-docs), CSCS's NCCL page for Alps, OLCF's
# PyTorch on Frontier, LLNL's launcher for the El Capitan family.
PUBLISHED = {
    "HPE": ("amd", {"HSA_FORCE_FINE_GRAIN_PCIE": "1", "FI_MR_CACHE_MONITOR": "userfaultfd",
                    "FI_CXI_DISABLE_HOST_REGISTER": "1", "FI_CXI_DEFAULT_CQ_SIZE": "131072",
                    "FI_CXI_RDZV_PROTO": "alt_read", "FI_CXI_RDZV_EAGER_SIZE": "0", "FI_CXI_RDZV_THRESHOLD": "0",
                    "FI_CXI_RDZV_GET_MIN": "0", "FI_CXI_DEFAULT_TX_SIZE": "2048", "NCCL_CROSS_NIC": "1",
                    "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3",
                    "FI_CXI_RX_MATCH_MODE": "hybrid"}),
    "CSCS": ("nvidia", {"NCCL_NET_GDR_LEVEL": "PHB", "NCCL_CROSS_NIC": "1", "NCCL_PROTO": "^LL128",
                        "FI_CXI_DEFAULT_CQ_SIZE": "131072", "FI_CXI_DEFAULT_TX_SIZE": "32768",
                        "FI_CXI_DISABLE_HOST_REGISTER": "1", "FI_CXI_RX_MATCH_MODE": "software",
                        "FI_MR_CACHE_MONITOR": "userfaultfd"}),
    "OLCF": ("amd", {"NCCL_SOCKET_IFNAME": "hsn0", "NCCL_NET_GDR_LEVEL": "3", "NCCL_CROSS_NIC": "1",
                     "FI_MR_CACHE_MONITOR": "userfaultfd", "FI_CXI_DEFAULT_CQ_SIZE": "131072"}),
    "LLNL": ("amd", {"FI_CXI_RDZV_PROTO": "alt_read", "FI_CXI_RDZV_THRESHOLD": "0", "FI_CXI_RDZV_GET_MIN": "0",
                     "FI_CXI_RDZV_EAGER_SIZE": "0", "FI_MR_CACHE_MONITOR": "userfaultfd",
                     "FI_CXI_DEFAULT_TX_SIZE": "1024", "FI_CXI_DISABLE_HOST_REGISTER": "1",
                     "FI_CXI_DEFAULT_CQ_SIZE": "131072", "FI_CXI_RX_MATCH_MODE": "hybrid", "NCCL_CROSS_NIC": "1",
                     "NCCL_SOCKET_IFNAME": "hsi0"}),
}


@pytest.mark.parametrize("site", PUBLISHED)
def test_every_value_a_site_publishes_is_accepted(site):
    """A site's own values pass; what it leaves unset is all that is said."""
    from torch_mojo.doctor.variables import review_site_settings

    gpu, published = PUBLISHED[site]
    findings = review_site_settings(published, "slingshot", gpu)
    assert all(" is unset: " in message for _, message in findings), findings


def cxi_devices(root, *states):
    """The cxi driver's sysfs layout: one device per rendezvous-get state."""
    for index, state in enumerate(states):
        properties = root / f"cxi{index}" / "device" / "properties"
        properties.mkdir(parents=True)
        (properties / "rdzv_get_en").write_text(f"{state}\n")
    return str(root)


@pytest.mark.parametrize("scheduler, variables, advice", [
    ("slurm", {"SLURM_JOB_ID": "42"}, "Slurm: `srun --network=disable_rdzv_get`"),
    ("flux", {"FLUX_JOB_ID": "f2Fr1"}, "Flux: `flux run --setattr=rdzv_get_en=0`"),
    ("pbs", {"PBS_JOBID": "7.pbs"}, "PBS Pro: `mpiexec --disable-rdzv-get"),
])
def test_alt_read_with_rendezvous_gets_on_is_told_with_the_schedulers_option(tmp_path, scheduler, variables, advice):
    from torch_mojo import launcher
    from torch_mojo.doctor.variables import WARNING, review_rendezvous_gets

    assert launcher.scheduler(variables) == scheduler
    environ = {"FI_CXI_RDZV_PROTO": "alt_read", **variables}
    [(severity, message)] = review_rendezvous_gets(environ, cxi_devices(tmp_path / "on", 0, 1))
    assert severity == WARNING and message.startswith("FI_CXI_RDZV_PROTO=alt_read, but rendezvous gets are on "
                                                      "(cxi1: rdzv_get_en=1)")
    assert f"launch the job with them off ({advice}" in message, message
    others = [each.name for name, each in site_settings.LAUNCHERS.items() if name != scheduler]
    assert not any(f"{other}:" in message for other in others)
    # Launched with them off, or another protocol: nothing to say.
    assert review_rendezvous_gets(environ, cxi_devices(tmp_path / "off", 0, 0)) == []
    assert review_rendezvous_gets({**variables, "FI_CXI_RDZV_PROTO": "default"},
                                  cxi_devices(tmp_path / "default", 1)) == []


def test_outside_a_known_scheduler_every_option_is_given(tmp_path):
    from torch_mojo.doctor.variables import review_rendezvous_gets

    [(_, message)] = review_rendezvous_gets({"FI_CXI_RDZV_PROTO": "alt_read"}, cxi_devices(tmp_path, 1))
    assert all(f"{each.name}: `{each.option}`" in message for each in site_settings.LAUNCHERS.values())
