"""The ``torch-mojo`` command."""

import argparse
import json
import os
import sys

from torch_mojo import __version__, site_settings
from torch_mojo.env import VARIABLES, cache_dir, markdown_table, shown_value


def info() -> dict:
    """What `torch-mojo info` reports, as data (`--json` prints it)."""
    import torch

    from torch_mojo import fabric_info, libraries, torchcomms
    from torch_mojo._paths import package_dir
    from torch_mojo.env import VARIABLES, review_environment

    try:
        from torch_mojo import _C

        built_with = _C.BUILT_WITH_TORCH
    except ImportError as error:
        built_with = f"C++ core not loadable: {error}"

    accelerator = libraries.current_accelerator()
    build = libraries.build_info()
    fabric = libraries.find_libfabric()
    fabric_details = fabric_info.libfabric_details(fabric.path) if fabric.path else {}
    review = review_environment()
    return {
        "torch_mojo": {"version": __version__, "package": package_dir()},
        "torch": {"version": torch.__version__, "torch_mojo_built_with": built_with},
        "kernels": {
            "library": os.path.join(package_dir(), "lib", "libtorch_mojo_kernels.so"),
            "mojo": build["mojo"],
            "cpu_target": build["kernel_cpu_target"],
            "max": build["max"] or None,
            "gpu_kernel": {target: image for target, (image, _) in libraries.gpu_kernel_images().items()},
        },
        "accelerator": str(accelerator) if accelerator else None,
        "accelerator_ccl": libraries.accelerator_ccl(),
        "collective_libraries": {device: libraries.with_version(lookup)
                                 for device, lookup in libraries.collective_libraries().items()},
        "libfabric": {**fabric.to_dict(), **fabric_details,
                      "between_nodes": fabric_info.fabric_provider_choice(fabric_details.get("providers", []))},
        "torchcomms": torchcomms.status(),
        "cache_dir": cache_dir(),
        "environment": {
            "set": review.known, "unknown": review.unknown, "invalid": review.invalid,
            "at_default": [variable.name for variable in VARIABLES if variable.name not in review.known],
        },
    }


def _print_info(report: dict) -> None:
    from torch_mojo import torchcomms

    kernels = report["kernels"]
    gpu = (f"GPU kernel for {', '.join(kernels['gpu_kernel'])} (MAX {kernels['max']})" if kernels["gpu_kernel"]
           else "no GPU kernel (MAX was not in the build environment)")
    print(f"torch-mojo {report['torch_mojo']['version']}  ({report['torch_mojo']['package']})")
    print(f"torch {report['torch']['version']}  (torch-mojo built with {report['torch']['torch_mojo_built_with']})")
    print(f"kernels: Mojo {kernels['mojo']}, CPU {kernels['cpu_target']}; {gpu}")
    print(f"accelerator: {report['accelerator'] or 'none (no GPU, or a CPU build of torch)'}")
    print(f"collective libraries (accelerators: {report['accelerator_ccl']}):")
    for device, lookup in report["collective_libraries"].items():
        where = f"{lookup['path']}  ({lookup['source']})" if lookup["path"] else \
            f"{lookup['source']}; searched {', '.join(lookup['searched'])}"
        if "version" in lookup:
            where += f"  version {lookup['version']}"
        if "load_error" in lookup:
            where += f"  DOES NOT LOAD: {lookup['load_error']}"
        print(f"  {device:5s} {lookup['library']:15s} {where}")
    fabric = report["libfabric"]
    if fabric["path"]:
        print(f"libfabric {fabric['version']}: {fabric['path']}  ({fabric['source']})")
        print(f"  providers: {', '.join(fabric['providers']) or 'none available on this machine'}")
        choice = fabric["between_nodes"]
        print(f"  between nodes: {choice['provider']} ({choice['source']}): "
              + ("offered" if choice["offered"] else "NOT offered here; set MOJOCCL_FABRIC_PROVIDER to one of the above"))
    else:
        print(f"libfabric: {fabric['source']}; searched {', '.join(fabric['searched'])}")
    print(torchcomms.status_line(report["torchcomms"]))
    print(f"cache dir: {report['cache_dir']}")
    environment = report["environment"]
    print("environment:")
    for name, value in environment["set"].items():
        problem = environment["invalid"].get(name)
        print(f"  {name}={value}" + (f"   INVALID: {problem}" if problem else ""))
    for name, note in environment["unknown"].items():
        print(f"  {name}={shown_value(name, os.environ.get(name, ''))}   UNKNOWN: {note}")
    print(f"  ({len(environment['at_default'])} more at their defaults: `torch-mojo env` lists them)")


def _modulefile(args):
    from torch_mojo import modulefile

    def pairs(option, form, values):
        for value in values:
            name, equals, rest = value.partition("=")
            if not equals:
                sys.exit(f"torch-mojo modulefile: {option} {value}: expected {form}")
            yield name, rest

    options = dict(network=args.network, gpu=args.gpu, net_plugin=args.net_plugin, launcher=args.launcher,
                   requires=args.requires, cache_dir=args.cache_dir,
                   settings=list(pairs("--setenv", "NAME=VALUE", args.setenv)),
                   prepends=list(pairs("--prepend-path", "NAME=DIR", args.prepend_path)))
    try:
        warning = modulefile.missing_plugin_warning(args.network, args.gpu, args.net_plugin)
        if warning:
            print(f"torch-mojo modulefile: warning: {warning}", file=sys.stderr)
        if args.output:
            path = modulefile.write(args.output, **options)
            print(f"wrote {path}\nto use it: module use {os.path.abspath(args.output)}; module load torch-mojo")
        else:
            sys.stdout.write(modulefile.render(**options))
    except ValueError as error:
        sys.exit(f"torch-mojo modulefile: {error}")
    return 0


def _bench(nproc, arguments):
    """Under torchrun, mpirun or srun: one rank of the benchmark. Otherwise
    start `nproc` ranks on this machine with torchrun."""
    from torch_mojo import bench, launcher

    if launcher.is_rank_of_a_job() or {"-h", "--help", "--model"} & set(arguments):
        return bench.main(arguments)
    import subprocess

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", "torch_mojo.bench", *arguments]
    return subprocess.call(command)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="torch-mojo", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    info_command = commands.add_parser("info", help="versions, libraries and the environment in effect")
    info_command.add_argument("--json", action="store_true", help="as JSON, for scripts")
    cache = commands.add_parser("cache", help="the cache directory")
    cache.add_argument("what", choices=["dir"])
    bench = commands.add_parser(
        "bench", help="collective benchmarks: mojo against gloo and MPI (see --help)", add_help=False)
    bench.add_argument("--nproc", type=int, default=2, help="ranks to start when not run under a launcher")
    commands.add_parser("doctor", help="check a job's set-up before it trains: run it as the job is run "
                        "(see --help)", add_help=False)
    module = commands.add_parser("modulefile", help="an Lmod modulefile for this installation")
    module.add_argument("--network", default="ethernet", choices=list(site_settings.NETWORKS),
                        help="the network between nodes, whose published settings the module sets (default ethernet)")
    module.add_argument("--gpu", default="none", choices=list(site_settings.GPUS),
                        help="the nodes' GPU vendor, likewise (default none)")
    module.add_argument("--net-plugin", metavar="DIR", help="the lib directory of RCCL/NCCL's libfabric plugin "
                        "(aws-ofi-nccl's, built for ROCm or CUDA): on LD_LIBRARY_PATH, with NCCL_NET set to use it")
    module.add_argument("--launcher", default="slurm", choices=list(site_settings.LAUNCHERS),
                        help="the site's scheduler, whose launch line the module's help gives (on Slingshot, with "
                        "rendezvous gets off; default slurm)")
    module.add_argument("--requires", action="append", default=[], metavar="MODULE",
                        help="a site module to load first (depends_on), e.g. rocm/6.4.3; repeatable")
    module.add_argument("--cache-dir", help="TORCH_MOJO_BACKEND_CACHE_DIR for every user, on a filesystem "
                        "all nodes see; $USER and other variables are expanded at load time")
    module.add_argument("--setenv", action="append", default=[], metavar="NAME=VALUE",
                        help="another variable the module sets; repeatable")
    module.add_argument("--prepend-path", action="append", default=[], metavar="NAME=DIR",
                        help="another directory the module prepends to a path variable; repeatable")
    module.add_argument("--output", metavar="ROOT", help="write ROOT/torch-mojo/<version>.lua (a MODULEPATH "
                        "entry) instead of printing the modulefile")
    env = commands.add_parser("env", help="the table of environment variables")
    env.add_argument("--markdown", action="store_true", help="as the table in docs/environment.md")
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return _bench(args.nproc, rest)
    if args.command == "doctor":
        from torch_mojo import doctor

        return doctor.main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "info":
        report = info()
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            _print_info(report)
    elif args.command == "modulefile":
        return _modulefile(args)
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
