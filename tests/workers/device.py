"""Collectives on the accelerator: a GPU (tests/test_device.py), or the
emulated device of tests/emulated_device when EMULATED_DEVICE_LIBRARY is
set (tests/test_emulated_device.py). Every rank uses the current device;
ranks may share one.

  collectives  each collective on device tensors, checked against values
               computed here; stream ordering; async Work; futures
  ddp          DDP steps on the device, against one process on the CPU
  timeout      rank 1 never joins rank 0's all_reduce (the watchdog's case)
  busbw        all_reduce / all_gather / reduce_scatter timings, one JSON
               line per size on rank 0
  peers        libmojoccl's device path (MOJOCCL_DEVICE_PEERS=1): all_reduce
               over datatypes and operations, and every collective it
               serves at sizes across its 64 MiB chunks
  doctor ARGS  `torch-mojo doctor ARGS` on the device
"""

import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import torch_mojo

# What `collectives` prints "ok <name>" for, on every rank.
CHECKS = ["all_reduce sum torch.float32", "all_reduce max", "all_reduce avg", "broadcast",
          "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "all_to_all_single",
          "async all_reduce after compute", "future value", "is_completed", "wait(timeout=) refused",
          "dropped tensors kept alive", "barrier"]


def assert_checked(results, library, version):
    """For the tests: every rank passed every check, on `library`."""
    import re

    for result in results:
        passed = {line[3:] for line in result.stdout.splitlines() if line.startswith("ok ")}
        assert set(CHECKS) <= passed, f"rank {result.rank} missed {set(CHECKS) - passed}"
        assert re.search(rf"\[TRACE\] collectives via /\S+/{re.escape(library)} \({version}", result.stderr), \
            result.stderr


def check(name, got, expected):
    torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
    print(f"ok {name}", flush=True)


def collectives(rank, size, device):
    ranks = torch.arange(size, dtype=torch.float32)
    n = 1 << 16
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        t = torch.full((n,), rank + 1, dtype=dtype, device=device)
        dist.all_reduce(t)
        check(f"all_reduce sum {dtype}", t, torch.full((n,), size * (size + 1) // 2, dtype=dtype))
    t = torch.full((n,), float(rank), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check("all_reduce max", t, torch.full((n,), float(size - 1)))
    t = torch.full((n,), float(rank), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    check("all_reduce avg", t, torch.full((n,), ranks.mean().item()))

    t = torch.full((n,), float(rank), device=device)
    dist.broadcast(t, src=size - 1)
    check("broadcast", t, torch.full((n,), float(size - 1)))

    out = torch.empty(size * n, device=device)
    dist.all_gather_into_tensor(out, torch.full((n,), float(rank), device=device))
    check("all_gather_into_tensor", out, ranks.repeat_interleave(n))
    parts = [torch.empty(n, device=device) for _ in range(size)]
    dist.all_gather(parts, torch.full((n,), float(rank), device=device))
    check("all_gather", torch.cat(parts), ranks.repeat_interleave(n))

    source = torch.arange(size * n, dtype=torch.float32, device=device)
    out = torch.empty(n, device=device)
    dist.reduce_scatter_tensor(out, source)
    check("reduce_scatter_tensor", out, size * torch.arange(rank * n, (rank + 1) * n, dtype=torch.float32))

    source = torch.full((size * 4,), float(rank), device=device)
    out = torch.empty(size * 4, device=device)
    dist.all_to_all_single(out, source)
    check("all_to_all_single", out, ranks.repeat_interleave(4))

    if size > 1:
        message = torch.full((n,), float(rank), device=device)
        received = torch.empty(n, device=device)
        ops = [dist.P2POp(dist.isend, message, (rank + 1) % size),
               dist.P2POp(dist.irecv, received, (rank - 1) % size)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        check("send/recv ring", received, torch.full((n,), float((rank - 1) % size)))
        # A batch that only sends (a pipeline's first stage) is ordered after
        # the caller's stream like any other.
        if rank == 0:
            payload = torch.full((n,), 42.0, device=device)
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, payload, 1)]):
                work.wait()
        elif rank == 1:
            got = torch.empty(n, device=device)
            for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, 0)]):
                work.wait()
            check("send-only batch", got, torch.full((n,), 42.0))

    # Stream order: the collective sees what the current stream computed
    # before it, and work on the current stream after wait() sees its result.
    big = torch.ones(1 << 24, device=device)
    big.mul_(rank + 1).add_(1)  # queued kernels, likely still running at issue
    work = dist.all_reduce(big, async_op=True)
    work.wait()
    total = big.sum()
    check("async all_reduce after compute", total, torch.tensor(float((1 << 24) * (size * (size + 1) // 2 + size))))
    work = dist.all_reduce(torch.ones(n, device=device), async_op=True)
    result = work.get_future().wait()[0]
    check("future value", result, torch.full((n,), float(size)))
    deadline = time.monotonic() + 30
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert work.is_completed(), "work.is_completed() stayed False for 30 s"
    print("ok is_completed", flush=True)
    try:
        dist.all_reduce(torch.ones(n, device=device), async_op=True).wait(timeout=datetime.timedelta(seconds=1))
        raise AssertionError("a finite work.wait(timeout=) was accepted on the device")
    except RuntimeError as error:
        assert "is not supported for" in str(error), error
        print("ok wait(timeout=) refused", flush=True)
    # Tensors the caller drops at once stay alive until the stream has passed
    # the collective: memory handed out meanwhile is not written by it.
    for _ in range(4):
        dist.all_reduce(torch.full((n,), 1.0, device=device), async_op=True)
    probes = torch.stack([torch.full((n,), 7.0, device=device) for _ in range(4)])
    torch.accelerator.synchronize()
    check("dropped tensors kept alive", probes, torch.full((4, n), 7.0))
    dist.barrier()
    print("ok barrier", flush=True)


def ddp(rank, size, device):
    """A few DDP steps on the device; every rank ends with the same model,
    which is the one a single process trains on the whole batch."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    model = DistributedDataParallel(__import__("copy").deepcopy(reference).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(5):
        inputs = torch.randn(size * 8, 16, generator=torch.Generator().manual_seed(step))
        targets = inputs.sum(dim=1, keepdim=True)
        mine = slice(rank * 8, (rank + 1) * 8)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs[mine].to(device)), targets[mine].to(device)).backward()
        optimizer.step()
        reference_optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(inputs), targets).backward()
        reference_optimizer.step()
    for (name, trained), expected in zip(model.module.named_parameters(), reference.parameters()):
        torch.testing.assert_close(trained.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")
    print("ok ddp matches one process", flush=True)


def busbw(rank, size, device):
    """nccl-tests' convention: bytes is the larger buffer of the call (the
    all_gather output, the reduce_scatter input); busbw = algbw x factor."""
    factors = {"all_reduce": 2 * (size - 1) / size, "all_gather": (size - 1) / size,
               "reduce_scatter": (size - 1) / size}
    for log2 in range(20, 29, 2):  # 1 MiB .. 256 MiB per rank
        numel = (1 << log2) // 4
        part = torch.ones(numel, device=device)
        whole = torch.ones(numel * size, device=device)
        calls = {
            "all_reduce": (numel * 4, lambda: dist.all_reduce(part)),
            "all_gather": (numel * 4 * size, lambda: dist.all_gather_into_tensor(whole, part)),
            "reduce_scatter": (numel * 4 * size, lambda: dist.reduce_scatter_tensor(part, whole)),
        }
        for name, (bytes_, call) in calls.items():
            seconds = median_seconds(call)
            if rank == 0:
                algbw = bytes_ / seconds / 1e9
                print(json.dumps({"collective": name, "bytes": bytes_, "ranks": size, "us": round(seconds * 1e6, 1),
                                  "algbw_GBps": round(algbw, 2), "busbw_GBps": round(algbw * factors[name], 2)}),
                      flush=True)


def median_seconds(call, calls=10, warmup=3) -> float:
    """The median time of `call` on the accelerator, after `warmup` calls."""
    times = []
    for iteration in range(warmup + calls):
        torch.accelerator.synchronize()
        start = time.perf_counter()
        call()
        torch.accelerator.synchronize()
        if iteration >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def peers(rank, size, device):
    """Values are small integers, so that every sum is exact in any order."""
    chunk = (64 << 20) // 4  # libmojoccl's device buffer, in float32 elements
    cases = [(torch.float32, dist.ReduceOp.SUM, 1), (torch.float32, dist.ReduceOp.SUM, chunk + 5),
             (torch.bfloat16, dist.ReduceOp.SUM, 1000), (torch.int64, dist.ReduceOp.MAX, 1000),
             (torch.int32, dist.ReduceOp.MIN, 1000), (torch.float32, dist.ReduceOp.AVG, 1000),
             (torch.float64, dist.ReduceOp.PRODUCT, 1000), (torch.uint8, dist.ReduceOp.SUM, 0)]
    for dtype, op, count in cases:
        pattern = torch.arange(count) % 7
        t = ((rank + 1) * pattern).to(dtype).to(device)
        dist.all_reduce(t, op=op)
        each = [((r + 1) * pattern).to(torch.float64) for r in range(size)]
        expected = {dist.ReduceOp.SUM: sum(each), dist.ReduceOp.MAX: torch.stack(each).amax(0),
                    dist.ReduceOp.MIN: torch.stack(each).amin(0), dist.ReduceOp.AVG: sum(each) / size,
                    dist.ReduceOp.PRODUCT: torch.stack(each).prod(0)}[op]
        check(f"peers {dtype} {op} {count}", t, expected.to(dtype))
    if os.environ.get("EMULATED_DEVICE_LIBRARY"):
        import ctypes

        from tests.emulated_device import emulated_runtime

        runtime = ctypes.CDLL(emulated_runtime())
        runtime.emulatedKernelLaunches.restype = ctypes.c_int64
        print(f"kernel launches {runtime.emulatedKernelLaunches()}", flush=True)

    slice_count = chunk // size + 1  # a reduce-scatter chunk holds every rank's part of the slices
    source = torch.arange(size * slice_count, dtype=torch.float32) % 1000
    out = torch.empty(slice_count, device=device)
    dist.reduce_scatter_tensor(out, ((rank + 1) * source).to(device))
    whole = sum(r + 1 for r in range(size)) * source
    check("peers reduce_scatter", out, whole[rank * slice_count:(rank + 1) * slice_count])

    part = torch.arange(chunk + 3, dtype=torch.int32) % 1000 + rank
    gathered = torch.empty(size * (chunk + 3), dtype=torch.int32, device=device)
    dist.all_gather_into_tensor(gathered, part.to(device))
    check("peers all_gather", gathered, torch.cat([part - rank + r for r in range(size)]))

    t = torch.full((chunk + 7,), float(rank), device=device)
    dist.broadcast(t, src=size - 1)
    check("peers broadcast", t, torch.full((chunk + 7,), float(size - 1)))

    t = torch.full((1000,), float(rank + 1), device=device)
    dist.reduce(t, dst=1)
    check("peers reduce", t, torch.full((1000,), float(size * (size + 1) // 2) if rank == 1 else float(rank + 1)))


def timeout(rank, size, device):
    if rank == 1:
        time.sleep(8)  # alive, but never joins the all_reduce
        sys.exit(0)
    t = torch.ones(1024, device=device)
    dist.all_reduce(t)
    print(f"value {t.cpu()[0].item()}", flush=True)  # waits on the stream: the watchdog ends the run


def main():
    scenario = sys.argv[1]
    if os.environ.get("EMULATED_DEVICE_LIBRARY"):
        from tests.emulated_device import install

        install()
    if scenario == "doctor":
        from torch_mojo import doctor

        sys.exit(doctor.main(sys.argv[2:]))
    torch_mojo.register_mojo_devices()
    accelerator = torch.accelerator.current_accelerator()
    timeout_s = 3 if scenario == "timeout" else 120
    dist.init_process_group(dist.get_default_backend_for_device(accelerator),
                            timeout=datetime.timedelta(seconds=timeout_s))
    device = torch.device(accelerator.type, torch.accelerator.current_device_index())
    {"collectives": collectives, "ddp": ddp, "busbw": busbw, "timeout": timeout, "peers": peers}[scenario](
        dist.get_rank(), dist.get_world_size(), device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
