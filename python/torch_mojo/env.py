"""The environment variables of torch-mojo: one table, the source of truth.

``docs/environment.md`` is generated from it (``torch-mojo env --markdown``,
checked by the tests), ``register_mojo_devices()`` validates the
environment against it, and ``torch-mojo info`` prints it with the values
in effect. libmojoccl states the names it reads, with their defaults and
what they accept, in its own table (cpp/ccl/base/settings.cc, listed by
mojocclSettings()); the tests check that every name the code reads is in
this table and that the two tables agree.
"""

from __future__ import annotations

import difflib
import os
import warnings
from dataclasses import dataclass

PREFIXES = ("TORCH_MOJO_BACKEND_", "MOJOCCL_")


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    effect: str
    choices: tuple[str, ...] = ()  # allowed values, when it is a choice
    listed: tuple[str, ...] = ()  # allowed items, when it may also be a comma-separated list of them
    int_range: tuple[int, int] | None = None  # allowed range, when it is an integer
    used: bool = True  # False: a name of the user guide this version does not read yet
    alias: str = ""  # an older name that means the same (PyTorch's NCCL-era names)
    secret: bool = False  # its value is never printed (info, doctor): shown_value() hides it
    must_agree: bool = False  # libmojoccl requires one value on every rank of a communicator

    def allowed(self) -> str:
        if self.listed:
            return f"{', '.join(self.choices)}, or a comma-separated list of {', '.join(self.listed)}"
        if self.choices:
            return ", ".join(self.choices)
        if self.int_range:
            return f"an integer from {self.int_range[0]} to {self.int_range[1]}"
        return "any text"

    def problem_with(self, value: str) -> str | None:
        """Why ``value`` is not valid, or None."""
        if value == "":
            return None  # empty means unset, as in the C++ readers
        if self.listed and value not in self.choices:
            if all(item in self.listed for item in value.split(",")):
                return None
            return f"{self.name}={value} is not valid: expected {self.allowed()}"
        if self.choices and value not in self.choices:
            return f"{self.name}={value} is not valid: expected one of {self.allowed()}"
        if self.int_range:
            low, high = self.int_range
            try:
                number = int(value)
            except ValueError:
                number = None
            if number is None or not low <= number <= high:
                return f"{self.name}={value} is not valid: expected {self.allowed()}"
        return None



def cache_dir() -> str:
    """Where torch-mojo keeps what it builds or fetches (TORCH_MOJO_BACKEND_CACHE_DIR)."""
    configured = os.environ.get("TORCH_MOJO_BACKEND_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch-mojo")

VARIABLES: tuple[Variable, ...] = (
    # The process group.
    Variable(
        "TORCH_MOJO_BACKEND_TRACE",
        "1",
        "`0` hides the `[TRACE] collectives via ...` line each rank prints at init",
        choices=("0", "1"),
    ),
    Variable(
        "TORCH_MOJO_BACKEND_CCL",
        "unset (vendor library)",
        "`mojo` runs accelerator collectives on libmojoccl (through host buffers) instead of NCCL/RCCL",
        choices=("mojo",),
    ),
    Variable(
        "TORCH_MOJO_BACKEND_CPU",
        "mojo",
        "library for CPU tensors: `mojo` (libmojoccl) or `gloo` (a private gloo group)",
        choices=("mojo", "gloo"),
        used=False,
    ),
    Variable(
        "TORCH_MOJO_BACKEND_NCCL_LIB",
        "site's, wheel, then system",
        "absolute path of the `libnccl.so.2` to load",
    ),
    Variable(
        "TORCH_MOJO_BACKEND_RCCL_LIB",
        "ROCm search",
        "absolute path of the `librccl.so.1` to load",
    ),
    Variable(
        "TORCH_MOJO_BACKEND_CACHE_DIR",
        "`$XDG_CACHE_HOME/torch-mojo` or `~/.cache/torch-mojo`",
        "cache directory (`torch-mojo cache dir` prints it); kernels are compiled when the "
        "package is built, so nothing is cached there at run time",
    ),
    Variable(
        "TORCH_MOJO_BACKEND_PG_WATCHDOG",
        "abort",
        "what a collective that outlives the `init_process_group` timeout (or a fatal library "
        "error) does: `abort` reports, dumps and exits with status 1, `raise` reports, dumps "
        "this rank and raises in the caller (the process goes on: shrink the group or exit), "
        "`report` only reports and dumps, `off` disables the watchdog and the flight recorder",
        choices=("abort", "raise", "report", "off"),
    ),
    # The watchdog and flight recorder: PyTorch's names, with their meaning.
    Variable(
        "TORCH_FR_BUFFER_SIZE",
        "2000",
        "collectives the flight recorder keeps; `0` turns it off. Recording costs about 1-2.7 us "
        "a call within a node (torch gathers the Python stack and the thread's name for each: "
        "`benchmarks/results/call-cost.txt`), as it does under ProcessGroupNCCL",
        int_range=(0, 10_000_000),
        alias="TORCH_NCCL_TRACE_BUFFER_SIZE",
    ),
    Variable(
        "TORCH_FR_DUMP_TEMP_FILE",
        "`~/.cache/torch/comm_lib_trace_rank_`",
        "dump file prefix; the global rank is appended, and `{job_id}` in it becomes the job's id "
        "(SLURM_JOB_ID, PBS_JOBID, LSB_JOBID, FLUX_JOB_ID or torchrun's run id; `nojob` without one)",
        alias="TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    ),
    Variable("TORCH_NCCL_DUMP_ON_TIMEOUT", "1", "`0`: a timeout does not dump", choices=("0", "1")),
    Variable(
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
        "unset",
        "stem of a pipe, `<stem><rank>.pipe`; writing to it dumps that rank",
    ),
    Variable(
        "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC",
        "15000",
        "how long the rank that timed out waits for the others' dumps",
        int_range=(0, 3_600_000),
    ),
    Variable(
        "TORCH_NCCL_COORD_CHECK_MILSEC",
        "1000",
        "how often a rank checks whether another one asked for its report and dump",
        int_range=(10, 3_600_000),
    ),
    Variable(
        "TORCH_INCLUDE_STACK_TRACE",
        "1",
        "Python stacks in the automatic dumps",
        choices=("0", "1"),
    ),
    Variable(
        "TORCH_INCLUDE_ONLY_ACTIVE",
        "0",
        "`1`: the automatic dumps hold only collectives that have not completed",
        choices=("0", "1"),
    ),
    # libmojoccl.
    Variable(
        "MOJOCCL_SOCKET_IFNAME",
        "an up, non-loopback interface with a default route",
        "network interface for the TCP bootstrap (`eth0`, a prefix `eth`, `^docker` to "
        "exclude, `=eth0` for an exact name), and for libfabric's `tcp` provider unless "
        "`MOJOCCL_FABRIC_DOMAIN` is set",
    ),
    Variable(
        "MOJOCCL_BOOTSTRAP_TIMEOUT_S",
        "120",
        "seconds communicator creation waits for every rank to check in",
        int_range=(1, 86400),
    ),
    Variable(
        "MOJOCCL_JOB_KEY",
        "none",
        "a secret every rank of a job is given (e.g. by the batch script: `export MOJOCCL_JOB_KEY=$(python3 -c "
        "'import secrets; print(secrets.token_hex(16))')`), mixed into the unique id's secret: a process that reads the "
        "c10d store but lacks it cannot join the job (docs/security.md). Must be the same on every rank; never "
        "printed",
        secret=True,
    ),
    Variable(
        "MOJOCCL_JOB_KEY_FILE",
        "none",
        "a file only its owner can read (mode 600) that holds the job key, instead of `MOJOCCL_JOB_KEY`",
    ),
    Variable(
        "MOJOCCL_HOSTID",
        "host name and boot id",
        "ranks with equal values share a node (shared memory); set it to split one "
        "machine into several nodes",
    ),
    Variable(
        "MOJOCCL_ALGO",
        "auto",
        "all-reduce algorithm inside a node: `one_shot`, `two_shot` or `auto` (by size "
        "and rank count)",
        choices=("auto", "one_shot", "two_shot"),
        must_agree=True,
    ),
    Variable(
        "MOJOCCL_NET_ALGO",
        "auto",
        "all-reduce algorithms between nodes, for calls past 64 KiB: `ring` (reduce-scatter and "
        "all-gather round the nodes, pipelined), `recursive_doubling` (log2 of the node count "
        "exchanges of the whole buffer), `rabenseifner` (reduce-scatter by recursive halving, "
        "all-gather by recursive doubling: the ring's bytes in 2 log2 of the node count steps) and "
        "`tree` (two binary trees, each reducing half the buffer to its root and broadcasting it "
        "back, pipelined: the ring's bytes in about 2 log2 of the node count steps, for any node "
        "count); `auto` lets a cost model choose per call among all four, a list among those it names. "
        "A reduce-scatter between nodes takes the first half of `ring` or `rabenseifner` (recursive "
        "halving), the ring where neither is listed. A broadcast past 64 KiB goes along the nodes, "
        "each passing each segment on to the next (`ring`), or down a binomial tree (any other), "
        "as the model chooses among those listed",
        choices=("auto",),
        listed=("ring", "recursive_doubling", "rabenseifner", "tree"),
        must_agree=True,
    ),
    Variable(
        "MOJOCCL_NET_DIRECT_NODES",
        "16",
        "up to this many nodes the leaders exchange directly, each sending every other one a message "
        "in one step: each call's frames (the agreement on the call, and the data of collectives up "
        "to 64 KiB) and a larger all-gather's blocks; past it the frames go by Bruck's all-gather, "
        "ceil(log2 of the node count) steps of one message each, and the blocks round the ring "
        "(each leader sending to one leader and receiving from another)",
        int_range=(1, 1048576),
        must_agree=True,
    ),
    Variable(
        "MOJOCCL_NET_FRAMES",
        "auto",
        "how the nodes' leaders exchange each call's frames (the agreement on the call, and the data "
        "of collectives up to 64 KiB): `socket` on TCP connections of their own, made and proven "
        "with the peer watch's (one send and one receive per frame: about half the round trip of "
        "libfabric's tcp provider), `fabric` on the libfabric endpoint; `auto` takes the sockets "
        "where the provider is tcp (or net, sockets, udp) up to 128 nodes (each leader holds a "
        "second connection to every other), and the fabric on RDMA providers (cxi, verbs, efa), "
        "whose round trip is shorter",
        choices=("auto", "socket", "fabric"),
        must_agree=True,
    ),
    Variable(
        "MOJOCCL_NET_RAILS",
        "1",
        "`1`: where every node has the same number of ranks, a large all-reduce and broadcast run on "
        "rails (local rank i of every node carries slice i between nodes, on its own endpoint and "
        "NIC), and so do a large all-gather and reduce-scatter where each node's ranks are consecutive "
        "(local rank i carries block i of every node); `0`: the node's first rank alone carries its "
        "bytes",
        choices=("0", "1"),
        must_agree=True,
    ),
    Variable(
        "MOJOCCL_ZERO_COPY",
        "1",
        "`0` stops ranks from reading each other's buffers in place (registered pool, "
        "process_vm_readv): every collective then stages its data through shared memory",
        choices=("0", "1"),
        must_agree=True,
    ),
    Variable(
        "MOJOCCL_DEVICE_PEERS",
        "0",
        "`1`: libmojoccl's collectives on GPU memory within a node map the other ranks' "
        "GPU buffers (IPC handles) and reduce them with the Mojo GPU kernel, instead of "
        "staging through host memory; off until it has run on GPUs",
        choices=("0", "1"),
        must_agree=True,
    ),
    Variable(
        "MOJOCCL_DETERMINISTIC",
        "0",
        "`1`: every floating-point sum, average and product of all_reduce, reduce and "
        "reduce_scatter is the rank-order one, ((x0 + x1) + x2) + ..., in the tensor's own "
        "dtype, bit for bit whatever the layout of ranks on nodes (docs/reproducible.md); "
        "`torch_mojo.set_deterministic()` and "
        "`torch.use_deterministic_algorithms(True)` turn it on",
        choices=("0", "1"),
        must_agree=True,
    ),
    Variable(
        "MOJOCCL_IB_TIMEOUT_S",
        "60",
        "seconds a rank waits for a live peer on another node without progress; it then "
        "prints a line naming the collective and the peer, and the call fails (a peer that "
        "dies is named at once)",
        int_range=(1, 86400),
    ),
    Variable(
        "MOJOCCL_NET",
        "fabric",
        "node-to-node transport: `fabric` (libfabric: cxi, verbs, tcp, ...); `verbs` is refused "
        "with advice, as InfiniBand is served by libfabric's verbs provider",
        choices=("verbs", "fabric"),
    ),
    Variable("MOJOCCL_IB_HCA", "chosen by GPU/NIC locality", "InfiniBand adapter to use", used=False),
    Variable(
        "MOJOCCL_FABRIC_DOMAIN",
        "by NUMA locality where the provider reports its NICs' PCI addresses, else the provider's first",
        "libfabric domain (NIC) to use, such as `cxi0`, `mlx5_0` or, for `tcp`, an interface; a "
        "comma-separated list (`cxi0,cxi1,cxi2,cxi3`) gives local rank i the (i mod n)th, so that "
        "each rank drives its own NIC",
    ),
    Variable(
        "MOJOCCL_FABRIC_PROVIDER",
        "auto",
        "libfabric provider between nodes: `auto` takes the first libfabric offers of `cxi` "
        "(Slingshot), `verbs` (InfiniBand), `efa`, then `tcp`, and warns when a fabric NIC is "
        "present but only tcp is offered; or one by name (with libfabric 1.17, `net` is faster "
        "than `tcp` on Ethernet); when it is absent the error names the providers there are",
    ),
    Variable(
        "MOJOCCL_LIBFABRIC",
        "the site's (build option), the system loader, then the Cray install",
        "path to `libfabric.so.1`",
    ),
    Variable(
        "MOJOCCL_REGION_MB",
        "256",
        "size of each rank's registered node-to-node staging buffer, in MiB, for providers that "
        "need registered buffers (`FI_MR_LOCAL`, as `verbs`); ordinary memory goes through it, "
        "`ncclMemAlloc` memory is registered in place; `0` turns it off, which such providers "
        "refuse",
        int_range=(0, 65536),
    ),
    Variable(
        "MOJOCCL_FABRIC_MR_LOCAL",
        "0",
        "`1` registers every buffer as providers that need `FI_MR_LOCAL` require, on any provider "
        "(runs that path on `tcp`, as the tests do)",
        choices=("0", "1"),
    ),
    Variable(
        "MOJOCCL_FABRIC_DIRECTED_RECV",
        "1",
        "`1`: receives between nodes take messages only from the communicator's ranks' addresses where the "
        "provider can (`FI_DIRECTED_RECV`); `0` takes any source, as on providers that cannot, every message's "
        "key still checked (runs that path on `tcp`, as the tests do; docs/security.md)",
        choices=("0", "1"),
    ),
    Variable(
        "MOJOCCL_NVLS",
        "on where every GPU supports it",
        "`0` disables the NVLink SHARP (multicast) path",
        choices=("0", "1"),
        used=False,
    ),
    Variable(
        "MOJOCCL_IB_TRACE",
        "0",
        "`1` prints, for each rank of a communicator spanning nodes, its node, its node's "
        "ranks and leader, and the provider, domain and libfabric in use",
        choices=("0", "1"),
    ),
)

BY_NAME = {variable.name: variable for variable in VARIABLES}
BY_NAME.update({variable.alias: variable for variable in VARIABLES if variable.alias})


@dataclass
class Review:
    """The torch-mojo variables of an environment, sorted out."""

    known: dict[str, str]  # name: value, for the variables of the table
    unknown: dict[str, str]  # name: a note, for names with our prefixes not in it
    invalid: dict[str, str]  # name: what is wrong with its value


def shown_value(name: str, value: str) -> str:
    """`value` as reports may print it: a secret's stays hidden, and so does
    that of an unknown name that looks like one (a misspelt MOJOCCL_JOBKEY)."""
    variable = BY_NAME.get(name)
    secret = variable.secret if variable is not None else (
        name.startswith(PREFIXES) and any(word in name for word in ("KEY", "SECRET", "TOKEN")))
    return "(set; not shown)" if secret and value else value


def closest_hint(name: str, known) -> str:
    """"; did you mean X?" for the name of `known` closest to `name`, or ""."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def review_environment(environ=None) -> Review:
    environ = os.environ if environ is None else environ
    review = Review({}, {}, {})
    for name in sorted(environ):
        variable = BY_NAME.get(name)
        if variable is None and not name.startswith(PREFIXES):
            continue  # not ours: the rest of the environment
        if variable is None:
            review.unknown[name] = f"{name} is not a torch-mojo variable and has no effect" + closest_hint(name, BY_NAME)
            continue
        review.known[name] = shown_value(name, environ[name])
        problem = variable.problem_with(environ[name])
        if problem:
            review.invalid[name] = problem.replace(variable.name, name, 1)
    return review


def check_environment(environ=None) -> list[str]:
    """Validates the torch-mojo variables in ``environ`` (default: os.environ).

    Raises ValueError naming the variable and the allowed values for a bad
    value. Returns warnings for unknown names (each with the closest real
    name when one is close), after issuing them with ``warnings.warn``.
    """
    review = review_environment(environ)
    for problem in review.invalid.values():
        raise ValueError(problem)
    notes = list(review.unknown.values())
    for note in notes:
        warnings.warn(note, stacklevel=3)
    return notes


def markdown_table() -> str:
    """The table of docs/environment.md."""
    lines = ["| Variable | Default | Allowed | Effect |", "|---|---|---|---|"]
    for variable in VARIABLES:
        effect = variable.effect if variable.used else f"{variable.effect} (not read by this version yet)"
        if variable.must_agree:
            effect += ". Must be the same on every rank, and on every replica group of a torchft job"
        name = f"`{variable.name}` (or `{variable.alias}`)" if variable.alias else f"`{variable.name}`"
        lines.append(f"| {name} | {variable.default} | {variable.allowed()} | {effect} |")
    return "\n".join(lines) + "\n"
