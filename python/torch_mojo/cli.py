"""The ``torch-mojo`` command."""

import argparse
import os
import sys

from torch_mojo import __version__
from torch_mojo.env import VARIABLES, markdown_table


def cache_dir():
    configured = os.environ.get("TORCH_MOJO_BACKEND_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch-mojo")


def _info():
    import torch

    from torch_mojo._paths import library_dir

    print(f"torch-mojo {__version__}")
    print(f"torch {torch.__version__}")
    try:
        from torch_mojo import _C

        print(f"built with torch {_C.BUILT_WITH_TORCH}")
    except ImportError as error:
        print(f"C++ core: not loadable ({error})")
    for library in ("libmojoccl.so", "libtorch_mojo_kernels.so"):
        path = os.path.join(library_dir(), library)
        print(f"{library}: {path if os.path.exists(path) else 'missing'}")
    print(f"cache dir: {cache_dir()}")
    print("environment:")
    for variable in VARIABLES:
        value = os.environ.get(variable.name)
        shown = value if value is not None else f"(default: {variable.default})"
        unread = "" if variable.used else "   [not read by this version yet]"
        print(f"  {variable.name}={shown}{unread}")


def _bench(nproc, arguments):
    """Under torchrun, mpirun or srun: one rank of the benchmark. Otherwise
    start `nproc` ranks on this machine with torchrun."""
    from torch_mojo import bench

    if "RANK" in os.environ or bench.launched_by_mpi() or "-h" in arguments or "--help" in arguments:
        return bench.main(arguments)
    import subprocess

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", "torch_mojo.bench", *arguments]
    return subprocess.call(command)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="torch-mojo", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, libraries and the environment in effect")
    cache = commands.add_parser("cache", help="the cache directory")
    cache.add_argument("what", choices=["dir"])
    bench = commands.add_parser(
        "bench", help="collective benchmarks: mojo against gloo and MPI (see --help)", add_help=False)
    bench.add_argument("--nproc", type=int, default=2, help="ranks to start when not run under a launcher")
    env = commands.add_parser("env", help="the table of environment variables")
    env.add_argument("--markdown", action="store_true", help="as the table in docs/environment.md")
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return _bench(args.nproc, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "info":
        _info()
    elif args.command == "cache":
        print(cache_dir())
    elif args.command == "env":
        if args.markdown:
            sys.stdout.write(markdown_table())
        else:
            for variable in VARIABLES:
                print(f"{variable.name}  (default {variable.default}; {variable.allowed()})")
                print(f"    {variable.effect}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
