"""`torch-mojo doctor --nccl-log`: the network RCCL/NCCL used between
nodes, read from NCCL_DEBUG=INFO logs written in the forms NCCL and RCCL
print (their `host:pid:tid [device] NCCL INFO` prefix and messages)."""

import json
import subprocess
import sys

import pytest

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
    assert "aws-ofi-rccl for ROCm 6" in result.stdout and 'NCCL_NET="AWS Libfabric"' in result.stdout
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


def test_the_plugin_files_looked_for_are_read_in_every_form():
    from torch_mojo.doctor import nccl_log

    for line, looked_for in [
        ("NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.", "libnccl-net.so"),
        ("NET/Plugin: Could not find: libnccl-net.so", "libnccl-net.so"),  # NCCL 2.28: no fallback text
        ("NET/Plugin: Could not find: ofi libnccl-net-ofi.so.", "ofi libnccl-net-ofi.so"),
        ("NET/Plugin : No plugin found (librccl-net.so), using internal implementation", "librccl-net.so"),
    ]:
        log = nccl_log.HostLog("n1")
        nccl_log.note(log, line)
        assert log.missing_plugin == looked_for, line


def test_sockets_within_one_node_are_fine_and_a_plugin_on_tcp_warns(tmp_path):
    alone = doctor(tmp_path, ONE_NODE)
    assert alone.returncode == 0 and alone.stdout.rstrip().endswith("0 errors, 0 warnings"), alone.stdout
    tcp = doctor(tmp_path, PLUGIN_ON_TCP)
    assert tcp.returncode == 0 and "runs over tcp;ofi_rxm, a socket provider" in tcp.stdout, tcp.stdout


def test_a_log_without_the_network_lines_says_how_to_get_them(tmp_path):
    nothing = doctor(tmp_path, "epoch 1 loss 0.3\n")
    assert nothing.returncode == 1 and "no NCCL INFO lines" in nothing.stdout
    version_only = doctor(tmp_path, "n1:1:1 [0] NCCL INFO NCCL version 2.27.7+cuda12.9\n")
    assert version_only.returncode == 1
    assert "error: n1: no line says which network NCCL/RCCL chose" in version_only.stdout
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
    both = review_net_plugin({"LD_LIBRARY_PATH": str(tmp_path), "NCCL_NET_PLUGIN": "ofi", "NCCL_NET": "AWS Libfabric",
                              "OFI_NCCL_GDR_FLUSH_DISABEL": "1"}, "rccl")
    assert [severity for severity, _ in both] == [WARNING, WARNING]
    assert "are both set: set one" in both[0][1]
    assert both[1][1].startswith("OFI_NCCL_GDR_FLUSH_DISABEL is not a variable librccl-net-ofi.so reads") \
        and "OFI_NCCL_GDR_FLUSH_DISABLE?" in both[1][1]
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
    from torch_mojo import site_settings
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
