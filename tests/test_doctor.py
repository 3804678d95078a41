"""`torch-mojo doctor`: one node and simulated nodes (MOJOCCL_HOSTID), with
each problem it looks for provoked for real: ranks pinned to one core
(taskset), misspelt and bad variables, a rank that never starts, nodes
that disagree on the provider or the domain, a cache directory that each
node mounts privately (a mount namespace), Slingshot settings."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.harness import ROOT, run_ranks
from torch_mojo.site_settings import SETTINGS


def published_by(name: str) -> str:
    """Who publishes the setting, as the table and the doctor name them."""
    return next(setting.source for setting in SETTINGS if setting.name == name)


DOCTOR = [sys.executable, "-m", "torch_mojo.doctor"]
FABRIC = {"MOJOCCL_FABRIC_PROVIDER": "tcp", "MOJOCCL_SOCKET_IFNAME": "lo"}


def doctor(*args, env=None, prefix=(), timeout=120):
    """`torch-mojo doctor` as a user runs it on one node."""
    return subprocess.run([*prefix, sys.executable, "-m", "torch_mojo.cli", "doctor", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)


def report(results):
    """Rank 0's JSON report of a job run with --json."""
    return json.loads(results[0].stdout)


def messages(summary, severity=None):
    return [item["message"] for item in summary["problems"] if severity in (None, item["severity"])]


def on_nodes(*hosts, **per_rank):
    return {rank: {"MOJOCCL_HOSTID": host, **per_rank.get(f"rank{rank}", {})} for rank, host in enumerate(hosts)}


def test_one_node_two_ranks():
    result = doctor("--nproc", "2", "--size", "4M")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("torch-mojo doctor: 2 ranks, 2 checked in, on 1 node (launcher: none)")
    header = next(line for line in lines if line.startswith("rank"))
    assert header.split()[:6] == ["rank", "node", "host", "local", "device", "cpus"]
    rows = [line.split() for line in lines[lines.index(header) + 1:lines.index(header) + 3]]
    assert [row[0] for row in rows] == ["0", "1"] and all("libmojoccl.so" in " ".join(row) for row in rows)
    assert any(line.strip().startswith("within node 0") and "GB/s" in line for line in lines)
    assert any(line.startswith("all_reduce of 4 MiB on every rank: correct") for line in lines)
    assert lines[-1] == "no problems found"

    as_json = doctor("--nproc", "2", "--size", "1M", "--json")
    summary = json.loads(as_json.stdout)
    assert as_json.returncode == 0 and summary["exit_status"] == 0 and summary["problems"] == []
    assert [facts["rank"] for facts in summary["ranks"]] == [0, 1] and len(summary["nodes"]) == 1
    assert summary["links"][0]["kind"] == "within node" and summary["all_reduce"]["correct"]
    assert summary["ranks"][0]["libraries"]["cpu"]["version"] == 100


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is not installed")
def test_ranks_pinned_to_one_core():
    result = doctor("--nproc", "2", "--size", "1M", prefix=["taskset", "-c", "0"])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 ranks on " in result.stdout and " share 1 core (0): the launcher pinned them together" in result.stdout
    assert "1 error" in result.stdout.splitlines()[-1]


def test_misspelt_and_bad_variables_and_slingshot_advice():
    nccl = subprocess.run([sys.executable, "-c", "from torch_mojo.libraries import find_nccl; print(find_nccl().path)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    env = {"MOJOCCL_FABRIC_PROVIDR": "tcp", "MOJOCCL_ALGO": "fastest", "FI_TCP_IFAEC": "lo",
           "FI_TCP_NODELAY": "maybe", "NCCL_DEBGU": "INFO", "NCCL_DEBUG": "LOUD",
           "MOJOCCL_FABRIC_PROVIDER": "cxi", "FI_CXI_DEFAULT_CQ_SIZE": "1024"}
    summary = report(run_ranks([*DOCTOR, "--json"], 1, env=env, timeout=120, check=False))
    errors, warnings = messages(summary, "error"), messages(summary, "warning")
    assert summary["exit_status"] == 1 and not summary["measured"]
    assert any(m.startswith("MOJOCCL_ALGO=fastest is not valid: expected one of auto, one_shot, two_shot") for m in errors)
    assert "FI_TCP_NODELAY=maybe is not a boolean (0/1, true/false, yes/no, on/off)" in errors
    assert any("MOJOCCL_FABRIC_PROVIDR is not a torch-mojo variable" in m and "MOJOCCL_FABRIC_PROVIDER?" in m
               for m in warnings)
    assert "FI_TCP_IFAEC is not a libfabric parameter and has no effect; did you mean FI_TCP_IFACE?" in warnings
    if nccl != "None":  # the NCCL wheel of requirements-dev.txt: its own list of names
        assert any(m.startswith("NCCL_DEBGU is not a variable libnccl.so.2 reads") and "NCCL_DEBUG?" in m
                   for m in warnings)
        assert "NCCL_DEBUG=LOUD is not one of VERSION, WARN, INFO, TRACE, ABORT" in warnings
    assert any(m.startswith(f"FI_CXI_DEFAULT_CQ_SIZE is 1024: {published_by('FI_CXI_DEFAULT_CQ_SIZE')} recommends "
                            "FI_CXI_DEFAULT_CQ_SIZE=131072 for CPUs on HPE Slingshot 11") for m in warnings)
    assert any(m.startswith(f"FI_MR_CACHE_MONITOR is unset: {published_by('FI_MR_CACHE_MONITOR')} recommends "
                            "FI_MR_CACHE_MONITOR=userfaultfd") for m in warnings)
    # Only what applies to a node without GPUs: none of RCCL's settings.
    assert not any(m.startswith(("NCCL_CROSS_NIC", "HSA_FORCE")) for m in warnings)


def test_a_rank_that_never_starts_is_reported_missing():
    # Two ranks of a job of three: rank 2 never starts.
    results = run_ranks([*DOCTOR, "--json"], 2, env={"WORLD_SIZE": "3", "MOJOCCL_BOOTSTRAP_TIMEOUT_S": "3"},
                        timeout=60, check=False)
    summary = report(results)
    assert summary["missing"] == [2] and [result.returncode for result in results] == [1, 1]
    missing = next(item for item in summary["problems"] if item["kind"] == "missing")
    assert missing["ranks"] == [2] and missing["message"].startswith("never checked in within 3 s (MOJOCCL_BOOTSTRAP")


def test_across_simulated_nodes():
    results = run_ranks([*DOCTOR, "--json", "--size", "1M"], 4, env=FABRIC, rank_env=on_nodes("a", "a", "b", "b"),
                        timeout=180)
    summary = report(results)
    assert summary["exit_status"] == 0 and messages(summary, "error") == []
    assert len(summary["nodes"]) == 2 and summary["all_reduce"]["correct"]
    kinds = sorted((link["kind"], link["a"], link["b"]) for link in summary["links"])
    assert kinds == [("between nodes", 0, 2), ("within node", 0, 1), ("within node", 2, 3)]
    assert all(facts["fabric"]["in_use"].startswith("tcp;ofi_rxm on lo") for facts in summary["ranks"])


@pytest.mark.parametrize("rank1, expected", [
    ({"MOJOCCL_FABRIC_DOMAIN": "eth0"}, "the ranks would not use the same libfabric domain between nodes (lo on"),
    ({"MOJOCCL_FABRIC_PROVIDER": "sockets"}, "MOJOCCL_FABRIC_PROVIDER is tcp on rank 0 and sockets on rank 1"),
], ids=["domain", "provider"])
def test_nodes_that_disagree_on_the_fabric(rank1, expected):
    if "MOJOCCL_FABRIC_DOMAIN" in rank1 and not os.path.exists("/sys/class/net/eth0"):
        pytest.skip("no eth0 here to be a second domain")
    rank_env = on_nodes("a", "b", rank0={"MOJOCCL_FABRIC_DOMAIN": "lo"}, rank1=rank1)
    results = run_ranks([*DOCTOR, "--json"], 2, env={"MOJOCCL_FABRIC_PROVIDER": "tcp"}, rank_env=rank_env,
                        timeout=60, check=False)
    summary = report(results)
    assert [result.returncode for result in results] == [1, 1] and not summary["measured"]
    assert any(expected in message for message in messages(summary, "error")), summary["problems"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a private mount per node needs root and unshare")
def test_a_cache_directory_that_is_not_shared(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    # Node b sees its own empty directory at the same path, as a node-local
    # /tmp would be.
    private = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs none "$0" && exec "$@"', str(cache)]
    results = run_ranks([*DOCTOR, "--json", "--size", "1M"], 2, env={**FABRIC, "TORCH_MOJO_BACKEND_CACHE_DIR": str(cache)},
                        rank_env=on_nodes("a", "b"), rank_prefix={1: private}, timeout=120, check=False)
    summary = report(results)
    assert summary["exit_status"] == 0, summary["problems"]
    warning = next(m for m in messages(summary, "warning") if m.startswith("the cache directory"))
    assert f"the cache directory {cache} is not shared between the nodes" in warning


@pytest.fixture(scope="module")
def fabric_nic(tmp_path_factory):
    """FI_PROVIDER_PATH with tests/fabric_nic's stand-in provider, built as
    libfabric's `cxi`: libfabric then reports a cxi NIC (domain cxi0)."""
    directory = tmp_path_factory.mktemp("providers")
    subprocess.run(["cc", "-shared", "-fPIC", '-DPROVIDER_NAME="cxi"', "-o", str(directory / "libcxi-fi.so"),
                    str(ROOT / "tests" / "fabric_nic" / "stand_in_provider.c"), "-l:libfabric.so.1"],
                   check=True, timeout=60)
    return str(directory)


def test_tcp_where_a_fabric_nic_is(fabric_nic):
    env = {**FABRIC, "FI_PROVIDER_PATH": fabric_nic}
    one_node = report(run_ranks([*DOCTOR, "--json", "--size", "1M"], 1, env=env, timeout=60))
    assert one_node["ranks"][0]["fabric"]["hardware"] == ["cxi"] and one_node["exit_status"] == 0
    expected = "collectives between nodes would go over TCP (tcp, from MOJOCCL_FABRIC_PROVIDER) although this " \
               "node has a fabric NIC (cxi): set MOJOCCL_FABRIC_PROVIDER=cxi"
    assert any(expected in message for message in messages(one_node, "warning"))
    results = run_ranks([*DOCTOR, "--json"], 2, env=env, rank_env=on_nodes("a", "b"), timeout=60, check=False)
    two_nodes = report(results)
    assert [result.returncode for result in results] == [1, 1] and not two_nodes["measured"]
    assert any(expected in message for message in messages(two_nodes, "error"))
