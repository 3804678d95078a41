"""Runs PyTorch's DistributedTest (on_mojo.py) and prints its count.

Usage: python -m tests.pytorch_suite.run [--world-size N] [--on mojo|gloo]
                                          [--subset] [--junit FILE]
  --on gloo   the same tests on gloo itself, for the comparison
  --subset    only SUBSET (what `make test` runs): every test that once
              failed on mojo, and a sample of the rest

Prints "on mojo at WORLD_SIZE=2: N passed, M skipped, F failed", then the
tests torch itself keeps from passing on any backend but gloo (TORCH_LIMITS,
expected to fail: each one is listed with its reason), then any other
failure. Exits 1 when a test outside TORCH_LIMITS fails.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Tests that fail on every backend registered from Python, for reasons in
# torch itself; docs/collectives.md lists them too.
TORCH_LIMITS = {
    "test_get_backend": "compares dist.get_backend() with the BACKEND the suite was started for "
                        "(\"gloo\"), and the groups are on mojo",
    "test_ddp_logging_data_cpu": "DDP's logger records ProcessGroup::getBackendName(), which torch "
                                 "answers \"custom\" for every backend registered from Python",
    "test_monitored_barrier_gloo": "torch's dist.monitored_barrier raises \"monitored_barrier is "
                                   "only implemented for GLOO backend\" for any other backend",
    "test_monitored_barrier_gloo_subgroup": "as test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_rank_0_timeout": "as test_monitored_barrier_gloo",
}

# What `make test` runs: a test for each fix made for the suite (all-gather
# coalesced, recv from any source, sparse all-reduce, the barrier timeout)
# and a sample of collectives, groups and DDP.
SUBSET = [
    "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_with_empty",
    "test_send_recv_any_source",
    "test_sparse_all_reduce_sum",
    "test_barrier_timeout_full_group",
    "test_all_reduce_coalesced_sum",
    "test_broadcast",
    "test_scatter",
    "test_batch_isend_irecv_gloo_tags",
    "test_DistributedDataParallelCPU",
    "test_accumulate_gradients_no_sync_allreduce_hook",
]


def counts(junit):
    """passed, skipped and failed test names from pytest's junit report."""
    passed, skipped, failed = [], [], []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = case.get("name")
        if case.find("skipped") is not None:
            skipped.append(name)
        elif case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        else:
            passed.append(name)
    return passed, skipped, failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--on", choices=["mojo", "gloo"], default="mojo")
    parser.add_argument("--subset", action="store_true")
    parser.add_argument("--junit", help="where pytest writes its report (default: a temporary file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pytorch-suite-") as temp:
        junit = args.junit or os.path.join(temp, "report.xml")
        module = "tests/pytorch_suite/on_mojo.py"
        selected = [f"{module}::TestDistBackendWithSpawn::{name}" for name in SUBSET] if args.subset else [module]
        command = [sys.executable, "-m", "pytest", *selected, "-q", "-p", "no:cacheprovider",
                   "-o", "addopts=", f"--junitxml={junit}"]
        env = {**os.environ, "BACKEND": "gloo", "WORLD_SIZE": str(args.world_size), "TEMP_DIR": temp,
               "PYTORCH_SUITE_ON": args.on, "PYTHONPATH": str(ROOT)}
        subprocess.run(command, cwd=ROOT, env=env, stdout=sys.stderr)
        passed, skipped, failed = counts(junit)
    print(f"on {args.on} at WORLD_SIZE={args.world_size}: {len(passed)} passed, "
          f"{len(skipped)} skipped, {len(failed)} failed")
    if not (passed or skipped or failed):
        sys.exit("no test ran: see pytest's output above")
    unexpected = [name for name in failed if args.on == "gloo" or name not in TORCH_LIMITS]
    limited = [name for name in failed if name not in unexpected]
    for name in limited:
        print(f"  torch's limit: {name}: {TORCH_LIMITS[name]}")
    for name in unexpected:
        print(f"  FAILED {name}")
    sys.exit(1 if unexpected else 0)


if __name__ == "__main__":
    main()
