# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
from spack_repo.torch_mojo.wheels import LinuxX86WheelPackage

from spack.package import *


class PyMojoCompiler(LinuxX86WheelPackage):
    """The Mojo compiler (`mojo`), as Modular ships it in a wheel. torch-mojo
    needs it to build its reduction kernels, not to run them."""

    homepage = "https://docs.modular.com/mojo/"
    pypi = "mojo-compiler/mojo_compiler-1.2.0-py3-none-manylinux_2_34_x86_64.whl"

    license("LicenseRef-Modular-Community-License")

    version(
        "1.2.0",
        sha256="3ee34a3b26c6cccaa9523a0e8db8f67bea954497d782d97c9e61c3c4ecbdac7b",
        expand=False,
    )

    depends_on("python@3.10:", type=("build", "run"))
    depends_on("py-mojo-compiler-mojo-libs@1.2.0", type="run", when="@1.2.0")

