# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
from spack_repo.torch_mojo.wheels import LinuxX86WheelPackage

from spack.package import *


class PyMaxCore(LinuxX86WheelPackage):
    """Modular's MAX runtime (a wheel). With it the Mojo compiler compiles
    for GPUs: torch-mojo needs it to build its GPU kernel (for sm_90,
    gfx942, ...), not to run it; no GPU is needed to compile."""

    homepage = "https://docs.modular.com/max/"
    pypi = "max-core/max_core-26.7.0-py3-none-manylinux_2_34_x86_64.whl"

    license("LicenseRef-MAX-Platform-Software-License")

    version(
        "26.7.0",
        sha256="59bd4c95b0e41ae1f006f65ab6e6270413b84a673b9ffc7fb6849eaf67c4119a",
        expand=False,
    )

    depends_on("python@3.10:", type=("build", "run"))
    depends_on("py-mojo-compiler@1.2.0", type="run", when="@26.7.0")
    depends_on("py-max-mojo-libs@26.7.0", type="run", when="@26.7.0")
    depends_on("py-max-shmem-libs@26.7.0", type="run", when="@26.7.0")
