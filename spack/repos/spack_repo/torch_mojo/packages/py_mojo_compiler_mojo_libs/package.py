# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
from spack_repo.torch_mojo.wheels import PypiWheelPackage

from spack.package import *


class PyMojoCompilerMojoLibs(PypiWheelPackage):
    """The Mojo standard library for the Mojo compiler (a wheel)."""

    homepage = "https://docs.modular.com/mojo/"
    pypi = "mojo-compiler-mojo-libs/mojo_compiler_mojo_libs-1.2.0-py3-none-any.whl"

    license("LicenseRef-Modular-Community-License")

    version(
        "1.2.0",
        sha256="3d631f7e798c11d0029c4a892ebae1f5742751fac0c526af74b45a8ae07c3acb",
        expand=False,
    )

