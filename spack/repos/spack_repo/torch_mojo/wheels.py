# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
"""Packages installed from wheels on PyPI."""

import glob
import os
import types

from spack_repo.builtin.build_systems.python import PythonPackage, PythonPipBuilder

from spack.package import requires, resource


def pypi_wheel_url(pypi: str) -> str:
    """Where PyPI keeps the wheel `pypi` names (as a package's `pypi`
    attribute does): Spack's own address for a source file of `pypi`
    (PythonPackage's url), under the wheel's Python tag instead of
    "source"."""
    python_tag = pypi.split("/")[1].split("-")[2]  # mojo_compiler-1.2.0-py3-none-...whl: py3
    source_url = PythonPackage.__dict__["url"].__get__(None, types.SimpleNamespace(pypi=pypi))
    return source_url.replace("/source/", f"/{python_tag}/", 1)


class PypiWheelPackage(PythonPackage):
    """`pypi = "<name>/<wheel file>"` names the wheel of one version; its
    versions are declared with `expand=False` (pip installs the wheel).
    Wheels declared with `wheel_resource` are installed with it, into the
    same prefix: packages shipped as several wheels expect one tree."""

    def url_for_version(self, version):
        project, wheel = self.pypi.split("/")
        listed_version = wheel.split("-")[1]
        return pypi_wheel_url(f"{project}/{wheel.replace(f'-{listed_version}-', f'-{version}-', 1)}")

    def install(self, spec, prefix):
        # The version's own wheel sits in the stage beside its resources'.
        wheels = set(glob.glob(os.path.join(self.stage.source_path, "**", "*.whl"), recursive=True))
        resources = sorted(wheels - {os.path.realpath(self.stage.archive_file), self.stage.archive_file})
        python("-m", "pip", *PythonPipBuilder.std_args(self), f"--prefix={prefix}",  # noqa: F821
               self.stage.archive_file, *resources)


def wheel_resource(pypi: str, sha256: str, when: str):
    """Another wheel installed with the package's own, `pypi` naming it as
    the `pypi` attribute does."""
    name = pypi.split("/")[0]
    resource(name=name, url=pypi_wheel_url(pypi), sha256=sha256, expand=False, placement=name, when=when)


class LinuxX86WheelPackage(PypiWheelPackage):
    """A wheel of x86_64 Linux binaries built against glibc 2.34
    (manylinux_2_34_x86_64)."""

    requires("target=x86_64:", msg="the wheel holds x86_64 binaries")
    requires("platform=linux", msg="the wheel holds Linux binaries")
