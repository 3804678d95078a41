# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
from spack_repo.torch_mojo.wheels import LinuxX86WheelPackage

from spack.package import *


class PyMaxShmemLibs(LinuxX86WheelPackage):
    """Libraries the MAX wheel (py-max-core) requires (a wheel)."""

    homepage = "https://docs.modular.com/max/"
    pypi = "max-shmem-libs/max_shmem_libs-26.7.0-py3-none-manylinux_2_34_x86_64.whl"

    license("LicenseRef-MAX-Platform-Software-License")

    version(
        "26.7.0",
        sha256="73a2108a76974eb75b061a27b793343a0fdafeca620fe548933b09797b48a6b4",
        expand=False,
    )

