"""torch-mojo bench runs, checks its own results and writes its files."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.harness import ROOT


def bench(tmp_path, *arguments, launcher=None, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCH_MOJO_BACKEND_TRACE": "0",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    command = launcher or [sys.executable, "-m", "torch_mojo.cli", "bench", "--nproc", "2"]
    result = subprocess.run([*command, *arguments, "--output", str(tmp_path / "out")], capture_output=True,
                            text=True, timeout=timeout, env=env, cwd=tmp_path, start_new_session=True)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    return result.stdout


def table_rows(stdout):
    return [line for line in stdout.splitlines() if line.strip() and line.strip()[0].isdigit()]


def test_collectives_table_csv_and_plot(tmp_path):
    out = bench(tmp_path, "--collectives", "all_reduce,all_to_all", "--sizes", "8,64K",
                "--backends", "mojo,mojo+pool,gloo,mojoccl,mojoccl+pool", "--min-seconds", "0.01")
    assert "mojo/gloo" in out and "mojoccl+pool/gloo" in out
    rows = table_rows(out)
    assert len(rows) == 4
    for row in rows:  # every backend's "#wrong" column says 0
        cells = [cell.split() for cell in row.split("|")[1:6]]
        assert all(cell[-1] == "0" for cell in cells), row
    assert (tmp_path / "out.csv").read_text().startswith("collective,size_bytes,count,type,backend")
    assert (tmp_path / "out.png").stat().st_size > 10_000


def test_across_two_nodes_of_two_ranks_with_the_wire_column(tmp_path):
    # The nodes are simulated (MOJOCCL_HOSTID): ranks 0, 1 and 2, 3; each
    # p2p swap and wire send-receive crosses between them, and their checked
    # runs say who sent it.
    out = bench(tmp_path, "--collectives", "all_reduce", "--sizes", "1M", "--backends", "mojo+fabric,p2p,wire",
                "--ranks-per-node", "2", "--min-seconds", "0.01", launcher=[
                    sys.executable, "-m", "torch_mojo.cli", "bench", "--nproc", "4"])
    assert "mojo+fabric/p2p" in out and "mojo+fabric/wire" in out
    [row] = table_rows(out)
    cells = [cell.split() for cell in row.split("|")[1:4]]
    assert all(cell[-1] == "0" for cell in cells), row
    with pytest.raises(AssertionError, match="must divide the 4 ranks into at least 2 nodes"):
        bench(tmp_path, "--backends", "p2p", "--ranks-per-node", "4",
              launcher=[sys.executable, "-m", "torch_mojo.cli", "bench", "--nproc", "4"])


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_under_mpirun_adds_the_mpi_column(tmp_path):
    out = bench(tmp_path, "--collectives", "all_reduce", "--sizes", "4K", "--backends", "mojo,mpi",
                "--min-seconds", "0.01",
                launcher=["mpirun", "-np", "2", "--bind-to", "none", sys.executable, "-m", "torch_mojo.bench"])
    assert "mojo/mpi" in out
    assert len(table_rows(out)) == 1


def test_kernels_and_ddp(tmp_path):
    out = bench(tmp_path, "--kernels", "--sizes", "64K", "--min-seconds", "0.01")
    assert "memcpy" in out and "mojo reduce" in out
    out = bench(tmp_path, "--ddp")
    assert "mojo+pool:" in out and "x gloo" in out


def test_model_chooses_the_algorithm_it_predicts_faster(tmp_path):
    measured = tmp_path / "measured.csv"
    measured.write_text("collective,size_bytes,count,type,backend,ranks,time_us,algbw_GBps,busbw_GBps,wrong\n"
                        "all_reduce,262144,65536,float32,mojo+fabric,2,321.0,0.8,0.8,0\n")
    out = bench(tmp_path, "--model", "--sizes", "8,256K,16M", "--measured", str(measured))
    rows = [line.split() for line in table_rows(out)]
    # 8 B travels in the leaders' frames, outside the model: 13 node counts x 2 sizes.
    assert len(rows) == 26 and {(row[1], row[2]) for row in rows} == {("256", "KiB"), ("16", "MiB")}
    algorithms = ["ring", "recursive_doubling", "rabenseifner", "tree"]
    preference = ["rabenseifner", "ring", "recursive_doubling", "tree"]  # on a tie
    for row in rows:
        predicted = dict(zip(algorithms, (float(time) for time in row[3:7])))
        fastest = min(predicted.values())
        assert row[7] == next(name for name in preference if predicted[name] == fastest), row
    by_case = {(int(row[0]), row[1] + row[2]): row for row in rows}
    assert by_case[(2, "16MiB")][7] == "rabenseifner"  # the ring's steps and bytes at 2 nodes: a tie
    assert by_case[(1024, "256KiB")][7] == "rabenseifner"  # 20 steps against the ring's 2046
    # 48 nodes: rabenseifner folds 16 of them in first, the tree has no such step.
    assert by_case[(48, "256KiB")][7] == "tree"
    assert by_case[(2, "256KiB")][8] == "321" and len(by_case[(4, "256KiB")]) == 8  # measured where given
    assert (tmp_path / "out-model.png").stat().st_size > 10_000

    env_ring = subprocess.run([sys.executable, "-m", "torch_mojo.cli", "bench", "--model", "--sizes", "256K"],
                              capture_output=True, text=True, timeout=60, cwd=ROOT,
                              env={**os.environ, "MOJOCCL_NET_ALGO": "ring"})
    assert {line.split()[7] for line in table_rows(env_ring.stdout)} == {"ring"}, env_ring.stdout + env_ring.stderr


def test_a_torch_without_gloo_is_told_why_the_bench_cannot_run():
    """Spack's py-torch+rocm has no gloo (builtin forbids +gloo+rocm)."""
    script = ("import sys, torch.distributed as dist; dist.is_gloo_available = lambda: False\n"
              "from torch_mojo import bench; bench.main(sys.argv[1:])")
    result = subprocess.run([sys.executable, "-c", script, "--sizes", "4K"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "RANK": "0", "WORLD_SIZE": "1",
                                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    assert result.returncode != 0
    assert "this torch was built without gloo (Spack's py-torch+rocm is)" in result.stderr


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_latency_layers_times_each_layer(tmp_path):
    # benchmarks/latency_layers.py, as benchmarks/run.sh runs it, with few calls.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    result = subprocess.run(["mpirun", "-np", "2", "--bind-to", "none", "--mca", "pml", "ob1", "--mca", "btl",
                             "self,tcp", sys.executable, str(ROOT / "benchmarks" / "latency_layers.py"), "8", "20"],
                            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, start_new_session=True)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    rows = [(line[:32].strip(), float(line[32:].split()[0]))
            for line in result.stdout.splitlines() if line and not line.startswith("#")]
    assert [name for name, _ in rows] == [
        "dist.all_reduce", "backend.allreduce(), blocking", "backend.allreduce(), async", "ncclAllReduce",
        "ncclAllReduce, frames on fabric", "mojocclWireSendRecv", "MPI_Allreduce", "MPI_Sendrecv",
        # every other collective three ways
        "dist.all_gather_into_tensor", "ncclAllGather", "MPI_Allgather",
        "dist.reduce_scatter_tensor", "ncclReduceScatter", "MPI_Reduce_scatter_block",
        "dist.broadcast", "ncclBroadcast", "MPI_Bcast",
        "dist.all_to_all_single", "ncclAllToAllv", "MPI_Alltoall"], result.stdout
    assert all(time > 0 for _, time in rows), result.stdout


def test_call_cost_times_each_collective_three_ways(tmp_path):
    # benchmarks/call_cost.py, as benchmarks/run.sh runs it, with few calls,
    # as 2 nodes: dist.*, torch's fake backend and the library alone.
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc-per-node=2",
                             str(ROOT / "benchmarks" / "call_cost.py"), "--nodes", "--rounds", "1", "--calls", "20"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path, start_new_session=True,
                            env={**os.environ, "TORCH_FR_BUFFER_SIZE": "0"})
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert "2 nodes of 1 rank, TORCH_FR_BUFFER_SIZE=0" in result.stdout, result.stdout
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[2:]}
    assert list(rows) == ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"], result.stdout
    assert all(float(row[1]) > 0 and float(row[3]) > 0 and float(row[5]) > 0 for row in rows.values()), result.stdout


def test_the_set_up_rehearsal_fits_its_points_and_models_a_cluster(tmp_path):
    # benchmarks/setup_simulated.py with few ranks and one round, modelled
    # from the recorded run across simulated nodes.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "setup_simulated.py"), "--ranks", "16,64,128",
                             "--rounds", "1", "--output", str(tmp_path / "out.txt")],
                            capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path, start_new_session=True)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    text = (tmp_path / "out.txt").read_text()
    measured = [line.split() for line in text.split("\n\n")[1].splitlines()[1:]]
    assert [int(row[0]) for row in measured] == [16, 64, 128], text
    assert all(float(row[-1].rstrip("x")) > 0 for row in measured), text
    assert re.search(r"\b\d+ exchanges \(one all-gather of \d+ bytes a rank", text), text
    model = text.split("model of a cluster")[1].splitlines()
    assert model[-1].split()[0] == "10000" and model[-1].endswith(" s"), text
