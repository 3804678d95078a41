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
- the rendezvous address: under srun (whatever its --mpi), the first host
  of the step's node list and a port derived from the job and step ids,
  so that two steps of one job differ; where mpirun or mpiexec launched
  the job, rank 0's host and a free port, broadcast with mpi4py. MPI is
  imported only there: an MPI built without Slurm's PMI aborts a task of
  `srun --mpi=pmi2` that imports it.
- the local world size: under srun, this node's own count of the step's
  tasks (SLURM_STEP_TASKS_PER_NODE, `2(x3),1`, by this node's place in
  SLURM_STEP_NODELIST), not the first node's.

A batch script that starts a script of several ranks without srun (or
torchrun) is told so, instead of torch's "RANK expected".

This module does not import torch.
"""

from __future__ import annotations

import os
import re
import socket
import warnings

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


def scheduler(environ=None) -> str | None:
    """The scheduler whose job this process runs in, by the variables each
    gives its jobs: "slurm", "flux", "pbs" (site_settings.LAUNCHERS), or
    None. torchrun within a Slurm job is Slurm's."""
    environ = os.environ if environ is None else environ
    for name, variable in (("slurm", "SLURM_JOB_ID"), ("flux", "FLUX_JOB_ID"), ("pbs", "PBS_JOBID")):
        if environ.get(variable):
            return name
    return None


def started_by_mpi() -> bool:
    """Whether mpirun or mpiexec started this process: MPI can then carry
    the rendezvous. A task of srun is not, whatever its --mpi: Slurm's own
    variables say all, and MPI may not speak Slurm's PMI."""
    return launcher() in ("openmpi", "pmi")


def is_rank_of_a_job() -> bool:
    """Whether a launcher (torchrun, srun, mpirun) or the caller (RANK)
    made this process a rank of a job, rather than a command to start one."""
    return "RANK" in os.environ or launcher() is not None


def _ranks(kind):
    """(rank, world size, local rank, local world size or None)."""
    if kind == "slurm":
        tasks = _first("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
        return os.environ["SLURM_PROCID"], tasks, _first("SLURM_LOCALID"), _slurm_tasks_on_this_node()
    if kind == "openmpi":
        return (os.environ["OMPI_COMM_WORLD_RANK"], _first("OMPI_COMM_WORLD_SIZE"),
                _first("OMPI_COMM_WORLD_LOCAL_RANK"), _first("OMPI_COMM_WORLD_LOCAL_SIZE"))
    return (os.environ["PMI_RANK"], os.environ["PMI_SIZE"], _first("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
            _first("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"))


def spans_nodes() -> bool:
    """Whether this rank's job has ranks on other nodes, as its launcher
    says: LOCAL_WORLD_SIZE below WORLD_SIZE (torchrun's, or srun's and
    mpirun's once adopted)."""
    try:
        return int(os.environ["WORLD_SIZE"]) > int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return False


def hosts(nodelist: str) -> list[str]:
    """The hosts of a SLURM node list, in order: "nid[0012-0013,0020],login1"
    -> ["nid0012", "nid0013", "nid0020", "login1"]."""
    found = []
    for match in re.finditer(r"([^,\[\]]+)(?:\[([^\]]+)\])?([^,\[\]]*)(?:,|$)", nodelist.strip()):
        prefix, ranges, suffix = match.groups()
        if not ranges:
            found.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            for number in range(int(low), int(high or low) + 1):
                found.append(f"{prefix}{number:0{len(low)}d}{suffix}")
    if not found:
        raise LauncherError(f"cannot read the SLURM node list {nodelist!r}")
    return found


def first_host(nodelist: str) -> str:
    return hosts(nodelist)[0]


def tasks_per_node(counts: str) -> list[int]:
    """SLURM's per-node task counts: "2(x3),1" -> [2, 2, 2, 1]."""
    found = []
    for part in counts.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise LauncherError(f"cannot read SLURM's tasks per node {counts!r}")
        found += [int(match.group(1))] * int(match.group(2) or 1)
    return found


def _slurm_tasks_on_this_node() -> str | None:
    """This node's count of the step's tasks, by its place in the step's
    node list (SLURMD_NODENAME, the name slurmd runs as)."""
    counts = _first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if counts is None:
        return None
    per_node = tasks_per_node(counts)
    nodelist, node = _first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"), _first("SLURMD_NODENAME")
    names = hosts(nodelist) if nodelist else []
    index = names.index(node) if node in names else int(_first("SLURM_NODEID") or 0)
    return str(per_node[index]) if index < len(per_node) else None


def rendezvous_port(job: int, step: int) -> int:
    """The port of a srun step's rendezvous, the same on every task: steps
    of a job, and jobs sharing a node, differ (until they wrap round)."""
    return 20000 + (job * 64 + step) % 20000


def _rendezvous(kind, rank):
    """MASTER_ADDR and MASTER_PORT: from MPI where mpirun launched the job,
    else from SLURM's node list, job and step ids."""
    if started_by_mpi():
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
        raise LauncherError("srun started this task, but SLURM_STEP_NODELIST or SLURM_JOB_ID is missing: "
                            "set MASTER_ADDR and MASTER_PORT")
    step = _first("SLURM_STEP_ID", "SLURM_STEPID") or "0"
    return first_host(nodelist), rendezvous_port(int(job), int(step) if step.isdigit() else 0)


def _warn_of_a_batch_script_of_several_tasks():
    """A script run by sbatch's batch script itself, in a job of several
    tasks: one process where the job asked for several. A warning, ahead
    of torch's own "RANK expected": a script that passes its rank and
    world size itself may rightly run so."""
    tasks = _first("SLURM_NTASKS")
    if _first("SLURM_JOB_ID") and "SLURM_STEP_ID" not in os.environ and tasks and tasks.isdigit() and int(tasks) > 1:
        warnings.warn(f"this process runs in the batch script of SLURM job {os.environ['SLURM_JOB_ID']}, which asks "
                      f"for {tasks} tasks, but srun did not start it: start the ranks with `srun python train.py` "
                      "(or `srun torchrun ...`, one per node) in the script", RuntimeWarning, stacklevel=3)


def _mpi4py_available():
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def adopt_launcher_environment(rendezvous: bool = True) -> str | None:
    """Sets torchrun's variables from srun's or mpirun's when torchrun did
    not start this process, and returns the launcher it found (None: none).
    Variables already set are kept. Without `rendezvous` only the ranks are
    set (use_local_rank_gpu needs no more, and must not start MPI)."""
    kind = launcher()
    if kind is None and "RANK" not in os.environ:
        _warn_of_a_batch_script_of_several_tasks()
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
