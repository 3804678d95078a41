"""The build floor (docs/install.md): the Mojo compiler's wheels need
x86_64 and glibc 2.34, which the docs and the Spack package state from the
one wheel tag, while what Mojo compiles needs no C library, so kernels
compiled elsewhere serve a site whose login nodes are older."""

import re
import subprocess

from tests.harness import ROOT
from torch_mojo._paths import library_dir

COMPILER = ROOT / "spack" / "repos" / "spack_repo" / "torch_mojo" / "packages" / "py_mojo_compiler" / "package.py"
PACKAGE = ROOT / "spack" / "repos" / "spack_repo" / "torch_mojo" / "packages" / "py_torch_mojo" / "package.py"


def wheel_floor() -> tuple[int, int, str]:
    """(major, minor, machine) of the Mojo compiler wheel's manylinux tag."""
    tag = re.search(r"manylinux_(\d+)_(\d+)_(\w+)\.whl", COMPILER.read_text())
    return int(tag.group(1)), int(tag.group(2)), tag.group(3)


def test_the_docs_and_the_spack_conflict_state_the_wheels_floor():
    major, minor, machine = wheel_floor()
    assert (major, minor, machine) == (2, 34, "x86_64")
    install = (ROOT / "docs" / "install.md").read_text()
    assert f"**The build floor: {machine} Linux with glibc {major}.{minor} or newer**" in install
    package = PACKAGE.read_text()
    assert f'conflicts("^glibc@:{major}.{minor - 1}",' in package
    assert f"needs glibc {major}.{minor} or newer" in package


def imported_glibc_versions(path) -> set[str]:
    symbols = subprocess.run(["objdump", "-T", str(path)], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"GLIBC_[\d.]+", symbols))


def needed(path) -> list[str]:
    dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)


def test_what_mojo_compiles_needs_no_c_library():
    kernels = f"{library_dir()}/libtorch_mojo_kernels.so"
    assert imported_glibc_versions(kernels) == set() and needed(kernels) == []
    # The C++ libraries, built by the site's own compiler, take the site's glibc.
    assert imported_glibc_versions(f"{library_dir()}/libmojoccl.so")
