"""``torch-mojo modulefile``: an Lmod modulefile for this installation.

The template (modulefiles/torch-mojo.lua.in) and the site variants
(modulefiles/sites/<site>.lua) are installed with the package; this module
fills in the paths of the installation that runs it, the site's choices
(module dependencies, a shared cache directory, extra variables) and writes
``<root>/torch-mojo/<version>.lua``, the layout Lmod expects under a
MODULEPATH entry.
"""

from __future__ import annotations

import importlib.metadata
import os
import re

from torch_mojo import __version__
from torch_mojo._paths import package_dir
from torch_mojo.env import BY_NAME, PREFIXES

PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


def templates_dir() -> str:
    return os.path.join(package_dir(), "modulefiles")


def sites() -> list[str]:
    """The site variants shipped with the package: generic, ..."""
    names = [name[: -len(".lua")] for name in os.listdir(os.path.join(templates_dir(), "sites"))]
    return sorted(names, key=lambda name: (name != "generic", name))


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


def render(site: str = "generic", requires=(), cache_dir: str | None = None, settings=(), prepends=()) -> str:
    """The modulefile text. `requires`: module names (e.g. rocm/6.4.3) it
    loads first with depends_on; `settings`: (NAME, VALUE) pairs it sets;
    `prepends`: (NAME, DIRECTORY) pairs it prepends to path variables (a
    Spack install's dependencies, whose prefixes differ from ours)."""
    if site not in sites():
        raise ValueError(f"unknown site {site!r}: expected one of {', '.join(sites())}")
    for option, pairs in (("--setenv", settings), ("--prepend-path", prepends)):
        for name, value in pairs:
            check_setting(option, name, value)
    with open(os.path.join(templates_dir(), "torch-mojo.lua.in")) as template:
        text = template.read()
    with open(os.path.join(templates_dir(), "sites", f"{site}.lua")) as fragment:
        site_settings = fragment.read().rstrip("\n")
    extra = [f'setenv("{name}", {lua_string(value)})' for name, value in settings]
    extra += [f'prepend_path("{name}", {lua_string(directory)})' for name, directory in prepends]
    values = {
        "VERSION": __version__,
        "SITE": site,
        "SITE_SETTINGS": "\n".join([site_settings, *extra]),
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
