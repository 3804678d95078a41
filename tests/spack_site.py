"""A Spack site for the tests, as a new site would set one up.

Spack 1.1.0 and its builtin package repository come from the tarballs in
../shared/vendor (their README says how Spack runs here offline). They are
unpacked once under .cache/spack-site/ and configured in the site scope of
that copy:

- the package repositories: torch-mojo's (this checkout) and builtin;
- no mirrors, no bootstrapping, no user configuration (SPACK_DISABLE_LOCAL_CONFIG);
- this machine's compilers and build tools, found by `spack compiler find`
  and `spack external find`, and the Python the test venv was made from.

`Workstation` adds, in a scope of its own, what an installation of
py-torch-mojo needs on a machine that reaches no source host: a venv's
torch and Python build tools and Debian's libfabric and nlohmann-json as
externals, and a local source mirror with the Mojo wheels (from PyPI, by
pip) and Spack's compiler wrapper (from ../shared/vendor). Every file is
checked against the checksum its package lists; the compiler wrapper's
vendored archive is not the release tarball builtin lists, so a package of
the tests' own repository (tests/spack/) gives its checksum.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

import yaml

from tests.harness import ROOT

VENDOR = ROOT.parent / "shared" / "vendor"
SPACK_TARBALL = "spack-1.1.0.tar.gz"
BUILTIN_TARBALL = "spack-packages-1e8cf05.tar.gz"
COMPILER_WRAPPER_TARBALL = "compiler-wrapper-1.1.0-source.tar.gz"
HOME = ROOT / ".cache" / "spack-site"
OUR_REPOSITORY = ROOT / "spack" / "repos" / "spack_repo" / "torch_mojo"
TESTS_REPOSITORY = ROOT / "tests" / "spack" / "spack_repo" / "torch_mojo_tests"
BUILD_TOOLS = ("cmake", "ninja", "gmake", "perl", "pkgconf")
# Only the system's tools: a venv's cmake or ninja on PATH is not the site's.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def missing() -> str | None:
    """Why there can be no Spack site here, or None."""
    absent = [name for name in (SPACK_TARBALL, BUILTIN_TARBALL, COMPILER_WRAPPER_TARBALL)
              if not (VENDOR / name).exists()]
    if absent:
        return f"Spack's sources are not here ({', '.join(absent)} missing from {VENDOR})"
    try:
        import clingo  # noqa: F401  Spack's concretizer
    except ImportError:
        return "clingo, Spack's solver, is not installed in this venv (it is in requirements-dev.txt)"
    if shutil.which("dpkg-query") is None:
        return "the site's libfabric and nlohmann-json are Debian's packages, and dpkg-query is not here"
    return None


def write_yaml(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def base_python() -> tuple[str, str]:
    """(version, prefix) of the interpreter this venv was made from."""
    return ".".join(map(str, sys.version_info[:3])), sys.base_prefix


class Site:
    def __init__(self, home: Path = HOME):
        self.home = home
        self.spack_root = home / SPACK_TARBALL.removesuffix(".tar.gz")
        self.builtin = home / BUILTIN_TARBALL.removesuffix(".tar.gz") / "repos" / "spack_repo" / "builtin"
        self.site_scope = self.spack_root / "etc" / "spack"

    def environ(self, path: str | None = None) -> dict:
        environ = {name: value for name, value in os.environ.items()
                   if not name.startswith(("SPACK_", "VIRTUAL_ENV", "PYTHON"))}
        environ.update(SPACK_PYTHON=sys.executable, SPACK_DISABLE_LOCAL_CONFIG="1",
                       SPACK_USER_CACHE_PATH=str(self.home / "user-cache"))
        if path:
            environ["PATH"] = path
        return environ

    def spack(self, *args, scopes=(), timeout=1200, path=None, cwd=None) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args, scopes=scopes), capture_output=True, text=True,
                              timeout=timeout, env=self.environ(path), cwd=cwd)

    def command(self, *args, scopes=()) -> list[str]:
        scope_args = [part for scope in scopes for part in ("-C", str(scope))]
        return [str(self.spack_root / "bin" / "spack"), *scope_args, *map(str, args)]

    def start(self, *args, scopes=(), path=None, cwd=None) -> subprocess.Popen:
        return subprocess.Popen(self.command(*args, scopes=scopes), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self.environ(path), cwd=cwd)

    def run_all(self, commands: dict[str, tuple], jobs: int = 2, timeout=1800) -> dict:
        """Runs the spack commands {name: (args, options)} `jobs` at a time
        (each solve keeps one core busy for a minute or two) and returns
        {name: CompletedProcess}."""
        pending, running, done = list(commands.items()), {}, {}
        while pending or running:
            while pending and len(running) < jobs:
                name, (args, options) = pending.pop(0)
                running[name] = (args, self.start(*args, **options))
            name = next(iter(running))
            args, process = running.pop(name)
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for _, other in [(args, process), *running.values()]:
                    other.kill()
                raise
            done[name] = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
        return done

    def check(self, *args, **options) -> str:
        result = self.spack(*args, **options)
        if result.returncode != 0:
            raise AssertionError(f"spack {' '.join(map(str, args))} failed ({result.returncode}):\n"
                                 f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}")
        return result.stdout

    def prepare(self) -> "Site":
        """Unpacks and configures the site once; later calls reuse it."""
        ready = self.home / "ready.json"
        stamp = {"tarballs": [SPACK_TARBALL, BUILTIN_TARBALL], "python": list(base_python()),
                 "repository": str(OUR_REPOSITORY)}
        if ready.exists() and json.loads(ready.read_text()) == stamp:
            return self
        for unpacked in (self.spack_root, self.builtin.parents[2], self.home / "user-cache"):
            shutil.rmtree(unpacked, ignore_errors=True)
        self.home.mkdir(parents=True, exist_ok=True)
        for name in (SPACK_TARBALL, BUILTIN_TARBALL):
            with tarfile.open(VENDOR / name) as archive:
                archive.extractall(self.home, filter="tar")
        self._configure()
        # The first command indexes builtin's ~9,000 packages (about two
        # minutes here); after that a command starts in seconds.
        self.check("providers", "mpi", path=SYSTEM_PATH)
        ready.write_text(json.dumps(stamp))
        return self

    def _configure(self):
        write_yaml(self.site_scope / "repos.yaml",
                   {"repos:": {"torch_mojo": str(OUR_REPOSITORY), "builtin": str(self.builtin)}})
        write_yaml(self.site_scope / "mirrors.yaml", {"mirrors:": {}})
        write_yaml(self.site_scope / "bootstrap.yaml", {"bootstrap": {"enable": False}})
        write_yaml(self.site_scope / "config.yaml", {"config": {"build_jobs": os.cpu_count() or 1}})
        self.check("compiler", "find", "--scope", "site", path=SYSTEM_PATH)
        self.check("external", "find", "--scope", "site", *BUILD_TOOLS, path=SYSTEM_PATH)
        packages_file = self.site_scope / "site" / "packages.yaml"  # where `--scope site` writes
        packages = yaml.safe_load(packages_file.read_text())
        version, prefix = base_python()
        packages["packages"]["python"] = {"externals": [{"spec": f"python@{version}", "prefix": prefix}]}
        write_yaml(packages_file, packages)


def python_requirement(name: str) -> str:
    """`name==version` as requirements-dev.txt pins it."""
    text = (ROOT / "requirements-dev.txt").read_text()
    return re.search(rf"^{re.escape(name)}==\S+", text, re.M).group(0)


class Workstation:
    """A scope for installing py-torch-mojo from this checkout: the site's
    Python packages from a venv of its own, Debian's libraries, a local
    source mirror, and an install tree under `root`."""

    VENV_PACKAGES = {  # Spack package: the venv's distribution
        "py-torch": "torch", "py-pybind11": "pybind11", "py-scikit-build-core": "scikit-build-core",
        "py-pip": "pip", "py-wheel": "wheel", "py-numpy": "numpy",
    }

    def __init__(self, site: Site, root: Path):
        self.site = site
        self.root = root
        self.scope = root / "scope"
        self.mirror = site.home / "mirror"
        self.venv = site.home / "site-venv"

    def prepare(self) -> "Workstation":
        self._make_venv()
        self._fill_mirror()
        version, _ = base_python()
        python_dependency = [{"spec": f"python@{version}"}]
        packages = {
            name: {"buildable": False, "externals": [{
                "spec": f"{name}@{self._venv_version(distribution)}" + self._variants_of(name),
                "prefix": str(self.venv), "dependencies": python_dependency}]}
            for name, distribution in self.VENV_PACKAGES.items()
        }
        packages["nlohmann-json"] = {"buildable": False, "externals": [
            {"spec": f"nlohmann-json@{debian_version('nlohmann-json3-dev')}", "prefix": "/usr"}]}
        packages["libfabric"] = {"buildable": False, "externals": [
            {"spec": f"libfabric@{debian_version('libfabric-dev')}", "prefix": "/usr"}]}
        write_yaml(self.scope / "packages.yaml", {"packages": packages})
        write_yaml(self.scope / "repos.yaml", {"repos:": {
            "torch_mojo_tests": str(TESTS_REPOSITORY), "torch_mojo": str(OUR_REPOSITORY),
            "builtin": str(self.site.builtin)}})
        write_yaml(self.scope / "mirrors.yaml", {"mirrors:": {"local": {
            "url": self.mirror.as_uri(), "binary": False, "source": True}}})
        write_yaml(self.scope / "config.yaml", {"config": {
            "install_tree": {"root": str(self.root / "opt")},
            "build_stage": [str(self.root / "stage")],
            "source_cache": str(self.root / "source-cache"),
        }})
        return self

    @staticmethod
    def _variants_of(name: str) -> str:
        # The CPU build of torch, with torch.distributed.
        return "+distributed~cuda~rocm" if name == "py-torch" else ""

    def _venv_version(self, distribution: str) -> str:
        python = self.venv / "bin" / "python"
        version = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        return version.split("+")[0]  # 2.13.0+cpu -> 2.13.0

    def _make_venv(self):
        python, ready = self.venv / "bin" / "python", self.venv / "ready"
        if ready.exists():
            return
        shutil.rmtree(self.venv, ignore_errors=True)  # what a failed attempt left
        venv.EnvBuilder(with_pip=True).create(self.venv)
        requirements = [python_requirement(name) for name in ("torch", "numpy", "pybind11", "scikit-build-core")]
        subprocess.run([python, "-m", "pip", "install", "--quiet", *requirements, "wheel"], check=True,
                       timeout=1800)
        ready.touch()

    def _fill_mirror(self):
        """The wheels py-mojo-compiler names (its own and its resources'),
        under the names a Spack source mirror keeps them by: their sha256."""
        package = OUR_REPOSITORY / "packages" / "py_mojo_compiler" / "package.py"
        wheels = re.findall(r'"([a-z-]+)/([a-z_]+)-([0-9.]+)-[^"]*\.whl"', package.read_text())
        downloads = self.site.home / "downloads"
        for project, _, version in wheels:
            if not list(downloads.glob(f"{project.replace('-', '_')}-{version}-*.whl")):
                subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                                "--dest", str(downloads), f"{project}=={version}"], check=True, timeout=1800)
        for wheel in downloads.glob("*.whl"):
            self._store(wheel, extension="")
        self._store(VENDOR / COMPILER_WRAPPER_TARBALL, extension=".tar.gz")

    def _store(self, path: Path, extension: str):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        target = self.mirror / "_source-cache" / "archive" / digest[:2] / (digest + extension)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target) if path.stat().st_dev == target.parent.stat().st_dev else shutil.copy(path, target)


def copy_environment(environment: Path, into: Path) -> Path:
    """A copy of a site environment of spack/environments/ in `into` (Spack
    writes its lock file beside spack.yaml), its relative paths made
    absolute: the checkout it builds and our package repository."""
    data = yaml.safe_load(environment.read_text())
    data["spack"]["develop"]["py-torch-mojo"]["path"] = str(ROOT)
    data["spack"]["repos"]["torch_mojo"] = str(OUR_REPOSITORY)
    write_yaml(into / "spack.yaml", data)
    return into


class Lock:
    """A concretized environment, read from its spack.lock."""

    def __init__(self, environment: Path):
        lock = json.loads((environment / "spack.lock").read_text())
        self.roots = [root["spec"] for root in lock["roots"]]
        self.nodes = lock["concrete_specs"]

    def has(self, name: str) -> bool:
        return any(node["name"] == name for node in self.nodes.values())

    def node(self, name: str) -> dict:
        matches = [node for node in self.nodes.values() if node["name"] == name]
        assert len(matches) == 1, f"{len(matches)} nodes named {name}"
        return matches[0]

    def variant(self, name: str, variant: str):
        return self.node(name)["parameters"][variant]

    def target(self, name: str) -> str:
        target = self.node(name)["arch"]["target"]
        return target if isinstance(target, str) else target["name"]

    def dependencies(self, name: str) -> set[str]:
        return {dependency["name"] for dependency in self.node(name)["dependencies"]}


def debian_version(package: str) -> str:
    """The upstream version of a Debian package: 1.17.0-3 -> 1.17.0."""
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True,
                             check=True).stdout
    return re.sub(r"^\d+:", "", version).split("-")[0]
