"""Runs torchcomms' own integration tests (comms/torchcomms/tests/
integration/py in its source tree) and its hooks' tests (comms/torchcomms/
hooks/*/tests/py: the flight recorder, the collective log) on `mojo`, one
torchrun job per file, and prints their count.

Usage: python -m tests.torchcomms_suite.run --source TORCHCOMMS_SOURCE
                                            [--world-size N] [--only NAME...]

Each file runs with TEST_BACKEND=mojo on CPU tensors (TEST_DEVICE=cpu).
Files that cannot apply to a CPU backend are not run: NOT_APPLICABLE says
why. Within a file, torchcomms' own skips (tests for one backend, or for
CUDA) count as skipped. Prints one line per file, then
"torchcomms' tests on mojo at WORLD_SIZE=N: P passed, S skipped, F failed
in K files (M not applicable)"; exits 1 when any test failed.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

NOT_APPLICABLE = {
    "CudaGraphs": "captures collectives into CUDA graphs: needs a CUDA device",
    "TimeoutTest": "every test in it is for ncclx alone (skip_unless_ncclx), and it loads the CUDA-graph "
                   "helpers (pydot)",
}

SUMMARY = re.compile(r"^Ran (\d+) tests? in ")
OUTCOME = re.compile(r"^(OK|FAILED)(?: \((.*)\))?$")


def not_applicable(name):
    for prefix, reason in NOT_APPLICABLE.items():
        if name.startswith(prefix):
            return reason
    return None


def counts(output):
    """(ran, skipped, failed) from the first rank's unittest summary, or
    None where no rank got as far as one."""
    lines = output.splitlines()
    for index, line in enumerate(lines):
        ran = SUMMARY.match(line)
        if not ran:
            continue
        for after in lines[index + 1:index + 4]:
            outcome = OUTCOME.match(after.strip())
            if outcome:
                fields = dict(part.split("=") for part in (outcome.group(2) or "").split(", ") if "=" in part)
                failed = int(fields.get("failures", 0)) + int(fields.get("errors", 0))
                return int(ran.group(1)), int(fields.get("skipped", 0)), failed
    return None


def run_file(path, world_size, timeout=400):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={world_size}", str(HERE / "on_mojo.py"), str(path)]
    env = {**os.environ, "TEST_BACKEND": "mojo", "TEST_DEVICE": "cpu"}
    try:
        # In a directory of its own: the compile tests leave torch_compile_debug/ where they run.
        with tempfile.TemporaryDirectory() as scratch:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=scratch)
    except subprocess.TimeoutExpired as expired:
        return None, f"did not finish within {timeout} s", str(expired.stderr or "")
    output = done.stdout + done.stderr
    found = counts(output)
    if done.returncode != 0 and (found is None or found[2] == 0):
        return None, f"exit {done.returncode} with no failing test", output
    return found, "", output


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True, help="torchcomms' source tree")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="these files (names without .py) alone")
    args = parser.parse_args()
    comms = Path(args.source) / "comms" / "torchcomms"
    # The integration tests, then the hooks' (the flight recorder's, the
    # collective log's), which watch a communicator of TEST_BACKEND's.
    files = sorted((comms / "tests" / "integration" / "py").glob("*Test.py"))
    files += sorted(comms.glob("hooks/*/tests/py/*Test.py"))
    if args.only:
        files = [path for path in files if path.stem in args.only]
    passed = skipped = failed = applicable = 0
    left_out = []
    problems = []
    for path in files:
        reason = not_applicable(path.stem)
        if reason:
            left_out.append(path.stem)
            print(f"{path.stem:40s} not applicable: {reason}", flush=True)
            continue
        applicable += 1
        started = time.monotonic()
        found, problem, output = run_file(path, args.world_size)
        took = f"({time.monotonic() - started:.0f} s)"
        if found is None:
            failed += 1
            problems.append((path.stem, problem, output))
            print(f"{path.stem:40s} FAILED: {problem} {took}", flush=True)
            continue
        ran, skips, failures = found
        passed += ran - skips - failures
        skipped += skips
        failed += failures
        print(f"{path.stem:40s} {ran - skips - failures} passed, {skips} skipped, {failures} failed {took}", flush=True)
        if failures:
            problems.append((path.stem, f"{failures} failed", output))
    for name, problem, output in problems:
        print(f"\n=== {name}: {problem}\n{output[-4000:]}")
    print(f"torchcomms' tests on mojo at WORLD_SIZE={args.world_size}: {passed} passed, {skipped} skipped, "
          f"{failed} failed in {applicable} files ({len(left_out)} not applicable)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
