"""Where a process stands in its job, whoever launched it.

torchrun exports RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
and MASTER_PORT, which torch's ``init_process_group()`` reads. HPC users
also start one process per GPU with ``srun python train.py`` or
``mpirun -np 4 python train.py``; :func:`adopt_launcher_environment` then
sets torchrun's variables from the launcher's, so the same script runs
unchanged:

- ranks: SLURM_PROCID / SLURM_LOCALID / SLURM_STEP_NUM_TASKS (a task of
  srun), OMPI_COMM_WORLD_RANK / _LOCAL_RANK / _SIZE (Open MPI), PMI_RANK /
  PMI_SIZE with MPI_LOCALRANKID (MPICH's Hydra, Cray PMI);
- the rendezvous address: rank 0's host and a free port, broadcast with
  mpi4py where MPI launched the job (mpirun, or srun --mpi=pmix); under a
  plain srun, the first host of the job's node list and a port derived from
  the job id.

This module does not import torch.
"""

from __future__ import annotations

import os
import re
import socket

class LauncherError(RuntimeError):
    pass


def _first(*names):
    for name in names:
        if os.environ.get(name, "") != "":
            return os.environ[name]
    return None


def launcher() -> str | None:
    """Which launcher started this process: "torchrun", "slurm" (a task of
    srun), "openmpi", "pmi" (MPICH's Hydra, Cray PMI), or None."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "torchrun"
    # SLURM_STEP_ID: a task of srun, not the batch script itself.
    if "SLURM_PROCID" in os.environ and "SLURM_STEP_ID" in os.environ:
        return "slurm"
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        return "openmpi"
    if "PMI_RANK" in os.environ and "PMI_SIZE" in os.environ:
        return "pmi"
    return None


def started_by_mpi() -> bool:
    """Whether MPI started this process (mpirun, or srun --mpi=pmix/pmi2):
    MPI can then carry the rendezvous."""
    return launcher() in ("openmpi", "pmi") or "PMIX_RANK" in os.environ or "PMI_RANK" in os.environ


def is_rank_of_a_job() -> bool:
    """Whether a launcher (torchrun, srun, mpirun) or the caller (RANK)
    made this process a rank of a job, rather than a command to start one."""
    return "RANK" in os.environ or launcher() is not None


def _ranks(kind):
    """(rank, world size, local rank, local world size or None)."""
    if kind == "slurm":
        tasks = _first("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
        per_node = _first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
        local_world = re.match(r"\d+", per_node).group(0) if per_node else None
        return os.environ["SLURM_PROCID"], tasks, _first("SLURM_LOCALID"), local_world
    if kind == "openmpi":
        return (os.environ["OMPI_COMM_WORLD_RANK"], _first("OMPI_COMM_WORLD_SIZE"),
                _first("OMPI_COMM_WORLD_LOCAL_RANK"), _first("OMPI_COMM_WORLD_LOCAL_SIZE"))
    return (os.environ["PMI_RANK"], os.environ["PMI_SIZE"], _first("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
            _first("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"))


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: "nid[0012-0015,0020],login1" ->
    "nid0012"."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise LauncherError(f"cannot read the SLURM node list {nodelist!r}")
    prefix, ranges = match.groups()
    return prefix + (re.split(r"[,-]", ranges)[0] if ranges else "")


def _rendezvous(kind, rank):
    """MASTER_ADDR and MASTER_PORT: from MPI where it launched the job, else
    from SLURM's node list and job id."""
    # srun --mpi=pmix (or pmi2) lets MPI start; plain srun does not, and
    # under srun mpi4py may be absent.
    if started_by_mpi() and (kind != "slurm" or _mpi4py_available()):
        from mpi4py import MPI

        address = None
        if rank == 0:
            with socket.socket() as sock:
                sock.bind(("", 0))
                address = (socket.gethostname(), sock.getsockname()[1])
        return MPI.COMM_WORLD.bcast(address, root=0)
    nodelist = _first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    job = _first("SLURM_JOB_ID", "SLURM_JOBID")
    if nodelist is None or job is None:
        raise LauncherError("srun started this task, but SLURM_JOB_NODELIST or SLURM_JOB_ID is missing: "
                            "set MASTER_ADDR and MASTER_PORT")
    # One port per job, the same on every task; jobs sharing a node differ.
    return first_host(nodelist), 20000 + int(job) % 20000


def _mpi4py_available():
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def adopt_launcher_environment(rendezvous: bool = True) -> str | None:
    """Sets torchrun's variables from srun's or mpirun's when torchrun did
    not start this process, and returns the launcher it found (None: none).
    Variables already set are kept. Without `rendezvous` only the ranks are
    set (use_local_rank_gpu needs no more, and must not start MPI)."""
    kind = launcher()
    if kind in (None, "torchrun"):
        return kind
    rank, world, local_rank, local_world = _ranks(kind)
    if world is None:
        raise LauncherError(f"{kind} started this process as rank {rank}, but the job's size is not set")
    values = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local_rank or "0",
              "LOCAL_WORLD_SIZE": local_world}
    for name, value in values.items():
        if value is not None:
            os.environ.setdefault(name, str(value))
    if rendezvous and ("MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ):
        if kind in ("openmpi", "pmi") and not _mpi4py_available():
            raise LauncherError(f"{kind} started this process, and the rendezvous address comes from rank 0 "
                                "through MPI: install mpi4py, or set MASTER_ADDR and MASTER_PORT")
        address, port = _rendezvous(kind, int(os.environ["RANK"]))
        os.environ.setdefault("MASTER_ADDR", address)
        os.environ.setdefault("MASTER_PORT", str(port))
    return kind
