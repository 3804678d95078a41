# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
from spack_repo.torch_mojo.wheels import PypiWheelPackage

from spack.package import *


class PyMaxMojoLibs(PypiWheelPackage):
    """MAX's Mojo libraries (a wheel), among them the GPU modules
    (`max.gpu`) torch-mojo's GPU kernel is written with."""

    homepage = "https://docs.modular.com/max/"
    pypi = "max-mojo-libs/max_mojo_libs-26.7.0-py3-none-any.whl"

    license("LicenseRef-MAX-Platform-Software-License")

    version(
        "26.7.0",
        sha256="c9eeaef01a19565b8467da9c6b7cd57fa787759ce5954140b0e031d095c630b9",
        expand=False,
    )
