"""A job is sealed: processes outside it knock on every port and endpoint it
opens, at init and while it runs, claiming its ranks; the job goes on,
every result right, the knocks turned away and counted (docs/security.md).

The strangers are real: TCP connections that speak the peer watch's and the
bootstrap's handshakes with another job's proof, and a libfabric program
(tests/strangers/fabric_stranger.c) that sends well-formed tagged messages
claiming each rank. A preloaded connect() delay (tests/strangers/delay_connect.c)
makes a chosen rank late, so that strangers reach a port before it does."""

import glob
import os
import socket
import struct
import subprocess
import threading
import time

import pytest

from tests.harness import ROOT, RanksJob, run_worker, worker_command

STRANGERS = ROOT / "tests" / "strangers"
FABRIC = {"MOJOCCL_FABRIC_PROVIDER": "tcp"}


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    built = tmp_path_factory.mktemp("strangers")
    subprocess.run(["cc", "-O1", "-o", str(built / "fabric_stranger"), str(STRANGERS / "fabric_stranger.c"),
                    "-l:libfabric.so.1"], check=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(built / "delay_connect.so"),
                    str(STRANGERS / "delay_connect.c"), "-ldl"], check=True)
    return built


def listening_ports(pids):
    """{(pid, "host:port")} of the IPv4 TCP sockets `pids` listen on, read
    from /proc as any process of the same user can."""
    inodes = {}
    for pid in pids:
        for fd in glob.glob(f"/proc/{pid}/fd/*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = pid
    found = set()
    with open("/proc/net/tcp") as file:
        for line in file.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                host, port = fields[1].split(":")
                address = socket.inet_ntoa(struct.pack("<I", int(host, 16)))
                found.add((inodes[fields[9]], f"{'127.0.0.1' if address == '0.0.0.0' else address}:{int(port, 16)}"))
    return found


# What a stranger says to a TCP port: a peer-watch handshake with another
# job's proof claiming rank 0, the protocol's old bare rank, a claim of a
# rank no job has, a bootstrap hello of another job, noise, and nothing.
KNOCKS = [
    struct.pack("=QQii", 0x4843544157434A4D, 0x1234, 0, 0),
    struct.pack("=i", 0),
    struct.pack("=QQii", 0x4843544157434A4D, 0x1234, 99, 0),
    struct.pack("=QQi", 0x4C43434F4A4F4D31, 0x1234, 2) + bytes(300),
    os.urandom(64),
    b"",
]


class Strangers:
    """Knocks on every port the job's processes listen on, as soon as it
    appears, with every knock, until stopped; a port that stays open (a
    libfabric endpoint's) also gets the fabric stranger."""

    def __init__(self, tools, job, world, fabric_seconds=3.0):
        self.tools, self.job, self.world, self.fabric_seconds = tools, job, world, fabric_seconds
        self.seen, self.knocks, self.fabric, self.since = set(), 0, [], {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def watch(self):
        pids = [process.pid for process, _, _ in self.job.processes]
        while not self.stopping.is_set():
            now = time.monotonic()
            for pid, address in listening_ports(pids):
                if (pid, address) not in self.seen:
                    self.seen.add((pid, address))
                    self.since[address] = now
                    for knock in KNOCKS:
                        threading.Thread(target=self.knock, args=(address, knock), daemon=True).start()
                elif address in self.since and now - self.since[address] > 0.3:
                    del self.since[address]  # open for good: an endpoint's
                    self.start_fabric_stranger(address)
            time.sleep(0.002)

    def start_fabric_stranger(self, address):
        # With the job's eager limit: ofi_rxm refuses connections that differ in it.
        self.fabric.append(subprocess.Popen(
            [str(self.tools / "fabric_stranger"), "tcp", str(self.fabric_seconds), str(self.world), "2000", "4000",
             address], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "FI_OFI_RXM_EAGER_LIMIT": "131072"}))

    def knock(self, address, payload):
        host, port = address.split(":")
        try:
            with socket.create_connection((host, int(port)), timeout=3) as connection:
                connection.sendall(payload)
                self.knocks += 1
                connection.settimeout(3)
                connection.recv(1024)  # held open until the job closes it
        except OSError:
            pass

    def stop(self):
        self.stopping.set()
        self.thread.join()
        return sum(int(process.communicate(timeout=30)[0].split()[-1] or 0) for process in self.fabric
                   if process.wait(timeout=30) == 0)


def sealed_results(results):
    """Every rank's (rounds, wrong, rejected) from its "ok sealed" line."""
    parsed = []
    for result in results:
        line = next(line for line in result.stdout.splitlines() if line.startswith("ok sealed"))
        parsed.append(tuple(int(field.split("=")[1]) for field in line.split()[2:]))
    return parsed


@pytest.mark.parametrize("hosts, directed", [(("a", "a"), "1"), (("a", "b", "c"), "1"), (("a", "a", "b", "b"), "0")],
                         ids=["one node", "3 nodes, directed receives", "2 nodes x 2 ranks, receives from any source"])
def test_strangers_at_every_port_change_nothing(tools, hosts, directed):
    # Rank 0 makes its first three connections (its own bootstrap root, the
    # other leaders' peer watches) a second late, so strangers reach those
    # ports first. With
    # receives from any source the strangers' messages meet the ranks'
    # receives, and only their key turns them away.
    world = len(hosts)
    rank_env = {rank: {"MOJOCCL_HOSTID": host} for rank, host in enumerate(hosts)}
    rank_env[0].update(LD_PRELOAD=str(tools / "delay_connect.so"), DELAY_CONNECT_MS="1000", DELAY_CONNECT_COUNT="3")
    env = {**FABRIC, "SECONDS": "2", "MOJOCCL_FABRIC_DIRECTED_RECV": directed}
    job = RanksJob(worker_command("ccl", "sealed"), world, env, rank_env, None)
    strangers = Strangers(tools, job, world)
    try:
        results = job.wait(120)
    finally:
        sent = strangers.stop()
    rows = sealed_results(results)
    assert all(rounds > 0 and wrong == 0 for rounds, wrong, _ in rows), rows
    assert strangers.knocks > 0, strangers.knocks
    warnings = "".join(result.stderr for result in results)
    # Rank 0 reaches its own bootstrap root late: a stranger's hello came first.
    assert "the bootstrap root turned away a process at " in warnings, warnings[-3000:]
    if len(set(hosts)) == 1:
        return  # no port or endpoint but the bootstrap's
    assert sent > 0, sent
    # The later nodes' leaders turned away the knocks on their peer-watch ports.
    assert sum(rejected for _, _, rejected in rows) > 0, rows
    assert "peer watch turned away a connection from " in warnings, warnings[-3000:]
    if directed == "0":
        assert "fabric endpoint turned away a message tagged as from rank " in warnings, warnings[-3000:]


def test_a_torch_job_with_a_job_key_among_strangers(tools):
    # The torch path: the unique id through the c10d store, the job key in
    # every rank's environment, strangers at every port; turned_away() counts.
    rank_env = {0: {"MOJOCCL_HOSTID": "a", "LD_PRELOAD": str(tools / "delay_connect.so"), "DELAY_CONNECT_MS": "1000",
                    "DELAY_CONNECT_COUNT": "4"},  # the store, its watch, the bootstrap, the peer watch
                1: {"MOJOCCL_HOSTID": "b"}}
    env = {**FABRIC, "SECONDS": "2", "MOJOCCL_JOB_KEY": "4f1c0de5", "TORCH_MOJO_BACKEND_TRACE": "0"}
    job = RanksJob(worker_command("sealed_torch"), 2, env, rank_env, None)
    strangers = Strangers(tools, job, 2)
    try:
        results = job.wait(120)
    finally:
        strangers.stop()
    rows = sealed_results(results)
    assert all(rounds > 0 and wrong == 0 for rounds, wrong, _ in rows), rows
    assert rows[1][2] > 0, rows  # rank 1 leads the second node: its peer watch turned knocks away


def test_two_jobs_alike_but_for_their_store_do_not_meet():
    # Same node names and sizes, both at once, ranks sharing memory within
    # each "node": shared-memory names carry the unique id's hash.
    hosts = {rank: {"MOJOCCL_HOSTID": host} for rank, host in enumerate("aabb")}
    jobs = [RanksJob(worker_command("ccl", "sealed"), 4, {**FABRIC, "SECONDS": "1"}, hosts, None) for _ in range(2)]
    for job in jobs:
        rows = sealed_results(job.wait(120))
        assert all(rounds > 0 and wrong == 0 and rejected == 0 for rounds, wrong, rejected in rows), rows


def test_a_job_key_keeps_out_a_process_that_read_the_store(tmp_path):
    # The intruder has the unique id (as a process reading the c10d store
    # would) and claims rank 1 before the real rank 1, which starts only
    # once the intruder is done; it has another job key. It is told at once,
    # and the job runs as if it had not been there.
    key_file = tmp_path / "job.key"
    key_file.write_text("the job's own secret\n")
    key_file.chmod(0o600)
    env = {"MOJOCCL_JOB_KEY_FILE": str(key_file), "SECONDS": "1"}
    wait_for_intruder = ["sh", "-c", 'while [ ! -e "$TEST_SCRATCH/intruder_done" ]; do sleep 0.05; done; exec "$@"', "sh"]
    job = RanksJob(worker_command("ccl", "sealed"), 2, env, None, {1: wait_for_intruder})
    id_file = os.path.join(job.scratch.name, "unique_id")
    deadline = time.monotonic() + 30
    while not os.path.exists(id_file) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        intruder = subprocess.run(
            worker_command("ccl", "init"), capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT), "RANK": "1", "WORLD_SIZE": "2",
                 "TEST_SCRATCH": job.scratch.name, "MOJOCCL_JOB_KEY": "another job's key"})
    finally:
        open(os.path.join(job.scratch.name, "intruder_done"), "w").close()
    rows = sealed_results(job.wait(60))
    assert all(rounds > 0 and wrong == 0 for rounds, wrong, _ in rows), rows
    assert ("the bootstrap root turned this process away: its unique id or MOJOCCL_JOB_KEY is not the "
            "communicator's") in intruder.stdout, intruder.stdout + intruder.stderr


def test_silent_connections_to_the_bootstrap_do_not_hold_up_the_ranks():
    # A hundred connections that say nothing, held open: each would have
    # held the root two seconds when it read hellos one at a time.
    from torch_mojo.mojoccl import Library

    uid = Library().unique_id()
    port, host = struct.unpack_from("!H", uid, 22)[0], socket.inet_ntoa(uid[24:28])
    silent = [socket.create_connection((host, port), timeout=5) for _ in range(100)]
    start = time.monotonic()
    results = run_worker("ccl", 2, "init", env={"UNIQUE_ID_HEX": uid.hex()}, timeout=60)
    elapsed = time.monotonic() - start
    for connection in silent:
        connection.close()
    assert all("ok all_reduce" in result.stdout for result in results)
    assert elapsed < 20, elapsed


def test_a_job_key_file_others_can_read_is_refused(tmp_path):
    key_file = tmp_path / "job.key"
    key_file.write_text("secret\n")
    key_file.chmod(0o644)
    (result,) = run_worker("ccl", 1, "init", env={"MOJOCCL_JOB_KEY_FILE": str(key_file)}, timeout=60, check=False)
    assert (f"MOJOCCL_JOB_KEY_FILE={key_file} can be read by others (mode 644): a job key only its owner reads "
            f"keeps a job sealed; chmod 600 {key_file}") in result.stdout + result.stderr


def test_ranks_with_different_job_keys_are_told_so():
    # A batch script that gave rank 1 another key: rank 1 learns it at once,
    # rank 0 at its bootstrap timeout, with the count of those turned away.
    results = run_worker("ccl", 2, "init", env={"MOJOCCL_JOB_KEY": "one", "MOJOCCL_BOOTSTRAP_TIMEOUT_S": "3"},
                         rank_env={1: {"MOJOCCL_JOB_KEY": "another"}}, timeout=60)
    assert "the bootstrap root turned this process away" in results[1].stdout, results[1].stdout
    assert ("rank(s) 1 of 2 did not join the communicator within 3 s (MOJOCCL_BOOTSTRAP_TIMEOUT_S); check that "
            "every rank reaches ncclCommInitRank with the same unique id (1 process(es) presenting another unique "
            "id or MOJOCCL_JOB_KEY were turned away: is MOJOCCL_JOB_KEY the same on every rank?)") in results[0].stdout


def test_the_job_key_is_never_printed():
    from torch_mojo import env
    from torch_mojo.doctor.facts import environment_of_interest

    environ = {"MOJOCCL_JOB_KEY": "s3cret", "MOJOCCL_JOB_KEY_FILE": "/home/me/.job.key", "SLINGSHOT_VNIS": "1234"}
    assert env.review_environment(environ).known == {"MOJOCCL_JOB_KEY": "(set; not shown)",
                                                     "MOJOCCL_JOB_KEY_FILE": "/home/me/.job.key"}
    shown = environment_of_interest(environ)
    assert shown["MOJOCCL_JOB_KEY"] == "(set; not shown)" and shown["SLINGSHOT_VNIS"] == "1234"  # the job's VNI
