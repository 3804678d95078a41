"""The process group's accelerator path, run for real on the CPU: the
emulated device of tests/emulated_device (host memory, asynchronous
streams whose copies run late) and a vendor library for it that, like
NCCL, only enqueues each call on its stream. Every collective's values,
stream ordering, Work and future semantics, tensors kept until their
collective has run, DDP, the watchdog on a collective in flight; libmojoccl
on device memory through host buffers, and refusing it when no runtime is
there to copy it.

Leaving out either stream wait of the process group (the collective's wait
for the caller's stream, or Work.wait()'s for the collective) makes
test_collectives_on_device_streams fail: the emulated copies run late
enough for a missing wait to read stale values."""

import json

import pytest

from tests.emulated_device import build
from tests.harness import run_worker
from tests.workers.device import assert_checked


@pytest.fixture(scope="module")
def device_env():
    return build()


# libmojoccl for the device's tensors, moving them through host buffers with
# the HIP runtime calls the emulated device answers.
LIBMOJOCCL = {"TORCH_MOJO_BACKEND_CCL": "mojo", "EMULATED_HIP": "1"}


def test_collectives_on_device_streams(device_env):
    results = run_worker("device", 2, "collectives", env=device_env, timeout=240)
    assert_checked(results, "libnccl_on_streams.so", "nccl version 100")
    assert all("ok send/recv ring" in result.stdout for result in results)
    assert "ok send-only batch" in results[1].stdout


def test_libmojoccl_moves_device_memory_through_host_buffers(device_env):
    results = run_worker("device", 2, "collectives", env={**device_env, **LIBMOJOCCL}, timeout=240)
    assert_checked(results, "libmojoccl.so", "mojoccl version 100")


@pytest.mark.parametrize("runtime", [{"EMULATED_HIP": "1"}, {"EMULATED_CUDA": "1"}], ids=["hip", "cuda"])
def test_libmojoccl_keeps_device_memory_on_the_devices(device_env, runtime):
    """MOJOCCL_DEVICE_PEERS=1: each rank maps the others' device buffers
    (IPC handles); the GPU kernel reduces them on its stream, or the runtime
    copies them. Here the emulated runtime (HIP with the gfx942 code object,
    or the CUDA driver with the sm_90 PTX) runs the kernel's own code on the
    CPU, with the arguments libmojoccl packed for the GPU."""
    env = {**device_env, "TORCH_MOJO_BACKEND_CCL": "mojo", **runtime, "MOJOCCL_DEVICE_PEERS": "1",
           "EMULATED_DEVICE_COPY_DELAY_US": "200"}
    results = run_worker("device", 3, "peers", env=env, timeout=300)
    launches = 2 + 6  # two for the case larger than the 64 MiB buffer, one for each other but the empty one
    for result in results:
        assert result.stdout.count("ok peers") == 12, result.stdout
        assert f"kernel launches {launches}" in result.stdout, result.stdout


def test_device_peers_fall_back_together_when_one_rank_cannot(device_env):
    """Rank 1's device is full: both ranks say so and stage through host
    memory, instead of rank 0 waiting for a buffer that never comes."""
    env = {**device_env, **LIBMOJOCCL, "MOJOCCL_DEVICE_PEERS": "1"}
    results = run_worker("device", 2, "collectives", env=env, rank_env={1: {"EMULATED_GPU_OUT_OF_MEMORY": "1"}},
                         timeout=240)
    assert_checked(results, "libmojoccl.so", "mojoccl version 100")
    assert "[mojoccl] rank 1: MOJOCCL_DEVICE_PEERS=1, but allocating 67108864 bytes of device memory failed in " \
           "the HIP runtime: out of memory (emulated); device memory goes through host buffers" in results[1].stderr
    assert "[mojoccl] rank 0: MOJOCCL_DEVICE_PEERS=1, but another rank cannot share its GPU memory" \
        in results[0].stderr


@pytest.mark.parametrize("library", [{}, LIBMOJOCCL, {**LIBMOJOCCL, "MOJOCCL_DEVICE_PEERS": "1"}],
                         ids=["nccl_on_streams", "libmojoccl", "libmojoccl_device_peers"])
def test_the_conformance_matrix_on_device_tensors(device_env, library):
    """The matrix's calls, dtypes, roots and layouts on device tensors (not
    its gloo comparisons, CPU pool, Work timeouts or mismatches)."""
    env = {**device_env, **library, "EMULATED_DEVICE_COPY_DELAY_US": "200"}
    results = run_worker("collectives", 3, "--device", env=env, timeout=400)
    for result in results:
        assert "checked" in result.stdout and "new_group" in result.stdout, result.stdout
        assert "device memory goes through host buffers" not in result.stderr, result.stderr  # no fallback


def test_ddp_on_the_device_matches_one_process(device_env):
    results = run_worker("device", 2, "ddp", env=device_env, timeout=240)
    assert all("ok ddp matches one process" in result.stdout for result in results)


def test_a_collective_in_flight_times_out_with_a_report(device_env):
    results = run_worker("device", 2, "timeout", env=device_env, timeout=120, check=False)
    rank0 = results[0]
    assert rank0.returncode == 1, rank0
    assert "Watchdog caught collective operation timeout: collective #1 (all_reduce 1024 x float32 sum) " \
           "on mojo:0 has not completed" in rank0.stderr, rank0.stderr
    assert "last collectives issued on mojo:0, oldest first:" in rank0.stderr


def test_libmojoccl_without_a_device_runtime_says_so_on_every_rank(device_env):
    env = {**device_env, "TORCH_MOJO_BACKEND_CCL": "mojo"}
    results = run_worker("device", 2, "collectives", env=env, timeout=120, check=False)
    for result in results:
        assert result.returncode != 0
        assert "libmojoccl was given device memory (a stream), but neither the CUDA driver (libcuda.so.1) " \
               "nor the HIP runtime (libamdhip64.so) is loaded" in result.stderr, result.stderr
        assert "[TRACE] collectives via" in result.stderr and "libmojoccl.so (mojoccl version 100)" in result.stderr


def test_the_doctor_reads_which_network_the_vendor_library_chose(device_env):
    """The doctor's job across 2 simulated nodes on the device, whose NCCL
    (the emulated one) chooses and logs its network as NCCL does. Without
    a plugin it logs sockets between nodes: an error. With the stand-in
    plugin on LD_LIBRARY_PATH and NCCL_NET naming its network: passes,
    with the warning that no GPU-direct RDMA was used (the emulated
    device's memory is host memory)."""
    env = {**device_env, "MOJOCCL_FABRIC_PROVIDER": "tcp", "MOJOCCL_SOCKET_IFNAME": "lo"}
    nodes = {0: {"MOJOCCL_HOSTID": "a"}, 1: {"MOJOCCL_HOSTID": "b"}}
    doctor = ("doctor", "--json", "--size", "64K")

    sockets = json.loads(run_worker("device", 2, *doctor, env=env, rank_env=nodes, timeout=240,
                                    check=False)[0].stdout)
    assert sockets["exit_status"] == 1 and sockets["all_reduce"]["correct"], sockets["problems"]
    [network] = sockets["vendor_networks"]
    assert network["networks"] == ["Socket"] and network["nodes"] == 2 and network["processes"] == 2
    [error] = [item for item in sockets["problems"] if item["severity"] == "error"]
    assert error["kind"] == "fabric" and error["message"].startswith(
        "on " + network["host"] + ': NCCL/RCCL used sockets between nodes ("Using network Socket"; it '
        "looked for libnccl-net.so and did not find it)")

    plugin = {**env, "LD_LIBRARY_PATH": device_env["EMULATED_NET_PLUGIN_DIR"], "NCCL_NET": "AWS Libfabric"}
    libfabric = json.loads(run_worker("device", 2, *doctor, env=plugin, rank_env=nodes, timeout=240,
                                      check=False)[0].stdout)
    assert libfabric["exit_status"] == 0, libfabric["problems"]
    [network] = libfabric["vendor_networks"]
    assert network["networks"] == ["AWS Libfabric"] and network["plugin"] == "AWS Libfabric"
    assert network["gpu_direct"] == {"AWS Libfabric": False}
    fabric = [item for item in libfabric["problems"] if item["kind"] == "fabric"]
    assert [item["message"].split(": ", 1)[1].split(" (")[0] for item in fabric] == [
        "AWS Libfabric carries data between nodes without GPU-direct RDMA"]
