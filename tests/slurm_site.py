"""A real Slurm on this machine, for the tests: Debian's slurm-wlm and
munge, one slurmctld and two slurmd, each slurmd a "node" of its own.

Each slurmd runs in namespaces of its own (unshare): its host name (n1,
n2: what a task's `hostname` says, and how torch-mojo tells nodes apart),
an /etc/hosts that names both nodes (a task's MASTER_ADDR is the first
node's name) and a node-local TmpFS (<home>/tmpfs, where PMIx makes its
job directories: the same path on every node, each node's own files).
Otherwise the nodes share the machine's file systems, as a cluster's nodes
share its home and scratch, so the checkout and its venv may be anywhere
(/tmp too). No cgroups (proctrack/linuxproc, task/none), no accounting. The daemons and munged run in the foreground as children of
the test process; stop() ends exactly those.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NODES = ("n1", "n2")
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/srun", "/usr/bin/sbatch")


def missing() -> str | None:
    """Why there can be no Slurm here, or None."""
    absent = [path for path in DAEMONS if not os.path.exists(path)]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing: `make slurm-check` installs slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root, and this is not root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    def __init__(self, home: Path):
        self.home = home
        self.processes: list[subprocess.Popen] = []
        self.conf = home / "slurm.conf"
        self.munge_socket = home / "munge" / "munge.socket"

    # ------------------------------------------------------------ set-up
    def write_config(self):
        for directory in ("munge", "state", "log", "tmpfs", *(f"spool/{node}" for node in NODES),
                          *(f"tmp/{node}" for node in NODES)):
            (self.home / directory).mkdir(parents=True, exist_ok=True)
        os.chmod(self.home / "munge", 0o700)
        key = self.home / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        hosts = Path("/etc/hosts").read_text() + "".join(f"127.0.0.1 {node}\n" for node in NODES)
        (self.home / "hosts").write_text(hosts)
        cpus = os.cpu_count() or 1
        ports = {node: free_port() for node in NODES}
        self.conf.write_text("\n".join([
            "ClusterName=torchmojo",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={self.home / 'state'}",
            f"SlurmdSpoolDir={self.home / 'spool'}/%n",
            f"SlurmctldPidFile={self.home / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.home / 'log'}/slurmd.%n.pid",
            f"SlurmctldLogFile={self.home / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.home / 'log'}/slurmd.%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            f"TmpFS={self.home / 'tmpfs'}", "MpiDefault=none", "ReturnToService=2", "SlurmdTimeout=60", "InactiveLimit=0",
            *(f"NodeName={node} NodeAddr=127.0.0.1 Port={ports[node]} CPUs={cpus} State=UNKNOWN" for node in NODES),
            f"PartitionName=test Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE",
            "",
        ]))

    def start(self) -> "Cluster":
        self.write_config()
        self._spawn(["/usr/sbin/munged", "-F", "--force", f"--socket={self.munge_socket}",
                     f"--key-file={self.home / 'munge' / 'munge.key'}", f"--pid-file={self.home / 'munge' / 'pid'}",
                     f"--log-file={self.home / 'munge' / 'log'}", f"--seed-file={self.home / 'munge' / 'seed'}"])
        self._wait_for(self.munge_socket.exists, "munged's socket")
        self._spawn(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in NODES:
            # Its own host name, /etc/hosts and TmpFS, then slurmd in its place.
            setup = (f"hostname {node} && mount --bind {self.home / 'hosts'} /etc/hosts && "
                     f"mount --bind {self.home / 'tmp' / node} {self.home / 'tmpfs'} && "
                     f"exec /usr/sbin/slurmd -D -f {self.conf}")
            self._spawn(["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", setup])
        self._wait_for(self._nodes_idle, "both nodes idle in sinfo", timeout=90)
        return self

    def _spawn(self, command):
        log = open(self.home / "log" / f"{Path(command[0]).name}-{len(self.processes)}.out", "w")
        self.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                               env=self.environ(), start_new_session=True))

    def _wait_for(self, ready, what: str, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [process.args for process in self.processes if process.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"{path.name}:\n{path.read_text()[-2000:]}" for path in (self.home / "log").iterdir()
                                 if path.is_file())
                self.stop()
                raise RuntimeError(f"the test Slurm did not come up ({what}; ended: {dead})\n{logs}")
            time.sleep(0.2)

    def _nodes_idle(self) -> bool:
        states = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30).stdout.split()
        return states.count("idle") == len(NODES)

    def stop(self):
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()

    # ------------------------------------------------------------ use
    def environ(self, extra: dict | None = None) -> dict:
        environ = {name: value for name, value in os.environ.items() if not name.startswith(("SLURM_", "PMI"))}
        environ["SLURM_CONF"] = str(self.conf)
        return {**environ, **(extra or {})}

    def run(self, command, timeout: float = 300, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=self.environ(env),
                              cwd=cwd)
