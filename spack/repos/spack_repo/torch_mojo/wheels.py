# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
"""Packages installed from a wheel on PyPI."""

from spack_repo.builtin.build_systems.python import PythonPackage

from spack.package import requires


class PypiWheelPackage(PythonPackage):
    """`pypi = "<name>/<wheel file>"` names the wheel of one version; its
    versions are declared with `expand=False` (pip installs the wheel)."""

    def url_for_version(self, version):
        # PyPI keeps a wheel under its Python tag where an sdist is under
        # "source": the address `pypi` gives, with that part and the version
        # changed.
        listed_version = self.pypi.split("/")[1].split("-")[1]
        return type(self).url.replace("/source/", "/py3/", 1).replace(listed_version, str(version))


class LinuxX86WheelPackage(PypiWheelPackage):
    """A wheel of x86_64 Linux binaries built against glibc 2.34
    (manylinux_2_34_x86_64)."""

    requires("target=x86_64:", msg="the wheel holds x86_64 binaries")
    requires("platform=linux", msg="the wheel holds Linux binaries")
