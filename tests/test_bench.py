"""torch-mojo bench runs, checks its own results and writes its files."""

import os
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
