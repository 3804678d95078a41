"""``torch-mojo modulefile``: an Lmod modulefile for this installation.

The template (modulefiles/torch-mojo.lua.in) and the help texts of each
network and GPU vendor (modulefiles/networks/, modulefiles/gpus/) are
installed with the package; this module fills in the paths of the
installation that runs it, the settings sites publish for its network and
GPUs (torch_mojo.site_settings), the libfabric plugin of RCCL/NCCL, the
site's choices (module dependencies, a shared cache directory, extra
variables) and writes ``<root>/torch-mojo/<version>.lua``, the layout Lmod
expects under a MODULEPATH entry.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re

from torch_mojo import __version__, site_settings
from torch_mojo._paths import package_dir
from torch_mojo.env import BY_NAME, PREFIXES
from torch_mojo.libraries import NET_PLUGIN_PREFIX

PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


def templates_dir() -> str:
    return os.path.join(package_dir(), "modulefiles")


def installed_paths() -> dict[str, str]:
    """Where this installation's command, Python package and libraries are.
    The command's directory comes from the package's install record, so it
    is right for a venv, a --prefix install or a Spack prefix alike."""
    library_dir = os.path.join(package_dir(), "lib")
    site_packages = os.path.dirname(package_dir())
    bin_dir = None
    for file in importlib.metadata.distribution("torch-mojo").files or []:
        if file.name == "torch-mojo" and file.parent.name == "bin":
            bin_dir = os.path.dirname(os.path.realpath(file.locate()))
    if bin_dir is None:
        raise RuntimeError("the torch-mojo command is not in this installation's record: reinstall torch-mojo")
    return {"BIN_DIR": bin_dir, "SITE_PACKAGES": site_packages, "LIB_DIR": library_dir}


def lua_string(text: str) -> str:
    """A Lua expression for `text`, where $NAME and ${NAME} stand for the
    environment variable at load time (a per-user cache path, say)."""
    pieces = []
    position = 0
    for match in re.finditer(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", text):
        if match.start() > position:
            pieces.append(_quoted(text[position:match.start()]))
        pieces.append(f'(os.getenv("{match.group(1)}") or "")')
        position = match.end()
    if position < len(text) or not pieces:
        pieces.append(_quoted(text[position:]))
    return " .. ".join(pieces)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_setting(option: str, name: str, value: str) -> None:
    """A torch-mojo variable must exist and take `value`; others (NCCL_*,
    a site's own) pass as they are."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"{option} {name}={value}: {name!r} is not a variable name")
    if name.startswith(PREFIXES):
        variable = BY_NAME.get(name)
        if variable is None:
            raise ValueError(f"{option} {name}: not a torch-mojo variable (`torch-mojo env` lists them)")
        problem = variable.problem_with(value)
        if problem:
            raise ValueError(f"{option}: {problem}")


def net_plugin_settings(gpu: str, directory: str) -> list[str]:
    """The lines that make RCCL/NCCL load the libfabric plugin in
    `directory` (aws-ofi-nccl's lib, built for ROCm or CUDA) and use it: the
    directory on LD_LIBRARY_PATH, NCCL_NET naming the plugin's network,
    and NCCL_NET_PLUGIN where the plugin has only a suffixed name."""
    if gpu == "none":
        raise ValueError("--net-plugin is RCCL's or NCCL's: name the GPUs too (--gpu amd or --gpu nvidia)")
    prefix = NET_PLUGIN_PREFIX["rccl" if gpu == "amd" else "nccl"]
    suffixed = sorted(glob.glob(os.path.join(directory, f"{prefix}-*.so")))
    if not os.path.exists(os.path.join(directory, f"{prefix}.so")) and not suffixed:
        raise ValueError(f"--net-plugin {directory}: no {prefix}.so (nor {prefix}-NAME.so) there; give the "
                         "plugin's lib directory (aws-ofi-nccl's, built for ROCm for RCCL, for CUDA for NCCL)")
    lines = ["-- RCCL/NCCL's libfabric plugin: without it they use sockets between nodes.",
             f'prepend_path("LD_LIBRARY_PATH", {lua_string(directory)})',
             f'pushenv("NCCL_NET", "{site_settings.PLUGIN_NETWORK}")']
    if not os.path.exists(os.path.join(directory, f"{prefix}.so")):
        name = os.path.basename(suffixed[0])[len(prefix) + 1: -len(".so")]
        lines.append(f'pushenv("NCCL_NET_PLUGIN", "{name}")  -- the plugin is {os.path.basename(suffixed[0])}')
    return lines


def missing_plugin_warning(network: str, gpu: str, net_plugin: str | None) -> str | None:
    """Why a module for GPUs on Slingshot without --net-plugin needs one."""
    if network == "slingshot" and gpu != "none" and not net_plugin:
        library = "RCCL" if gpu == "amd" else "NCCL"
        return (f"no --net-plugin: unless another module puts the libfabric plugin on LD_LIBRARY_PATH, {library} "
                "will use sockets between nodes (many times slower); `torch-mojo doctor` checks it")
    return None


def machine_lines(network: str, gpu: str, net_plugin: str | None, launcher: str = "slurm",
                  overridden=()) -> list[str]:
    """The help texts of the network and the GPUs (with the launch line of
    the site's `launcher`), and the settings sites publish for them, each
    with its reason. pushenv, so that unloading gives back a value the
    user had set before. The site's own choice of a variable (`overridden`:
    the names of its --setenv) replaces ours."""
    lines = []
    for kind, name in (("networks", network), ("gpus", gpu)):
        with open(os.path.join(templates_dir(), kind, f"{name}.lua")) as fragment:
            text = fragment.read().rstrip("\n")
        lines.append(text.replace("@LAUNCH_LINE@", site_settings.LAUNCHERS[launcher].example))
    for setting in site_settings.for_machine(network, gpu):
        if setting.name in overridden:
            continue
        lines += [f"-- {setting.reason} [{setting.source}]", f'pushenv("{setting.name}", {lua_string(setting.value)})']
    if net_plugin:
        lines += net_plugin_settings(gpu, net_plugin)
    return lines


def render(network: str = "ethernet", gpu: str = "none", net_plugin: str | None = None, launcher: str = "slurm",
           requires=(), cache_dir: str | None = None, settings=(), prepends=()) -> str:
    """The modulefile text for nodes of `network` and `gpu` (site_settings'
    names), with RCCL/NCCL's libfabric plugin from the directory
    `net_plugin`, for jobs started by `launcher` (site_settings.LAUNCHERS).
    `requires`: module names (e.g. rocm/6.4.3) it loads first
    with depends_on; `settings`: (NAME, VALUE) pairs it sets (after the
    sites' own, so they win); `prepends`: (NAME, DIRECTORY) pairs it
    prepends to path variables (a Spack install's dependencies, whose
    prefixes differ from ours)."""
    title = site_settings.machine_title(network, gpu)  # checks both names
    if launcher not in site_settings.LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}: expected one of {', '.join(site_settings.LAUNCHERS)}")
    for option, pairs in (("--setenv", settings), ("--prepend-path", prepends)):
        for name, value in pairs:
            check_setting(option, name, value)
    with open(os.path.join(templates_dir(), "torch-mojo.lua.in")) as template:
        text = template.read()
    extra = [f'setenv("{name}", {lua_string(value)})' for name, value in settings]
    extra += [f'prepend_path("{name}", {lua_string(directory)})' for name, directory in prepends]
    values = {
        "VERSION": __version__,
        "TITLE": title,
        "MACHINE": "\n".join([*machine_lines(network, gpu, net_plugin, launcher, {name for name, _ in settings}),
                               *extra]),
        "DEPENDENCIES": "\n".join(f'depends_on("{module}")' for module in requires),
        "CACHE_DIR": (f'setenv("TORCH_MOJO_BACKEND_CACHE_DIR", {lua_string(cache_dir)})' if cache_dir else
                      "-- TORCH_MOJO_BACKEND_CACHE_DIR: not set by the site (`torch-mojo modulefile --cache-dir`)"),
        **installed_paths(),
    }
    rendered = PLACEHOLDER.sub(lambda match: values[match.group(1)], text)
    return re.sub(r"\n{3,}", "\n\n", rendered)


def write(root: str, **options) -> str:
    """Writes <root>/torch-mojo/<version>.lua; returns its path."""
    directory = os.path.join(root, "torch-mojo")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{__version__}.lua")
    with open(path, "w") as file:
        file.write(render(**options))
    return path
