# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
from spack_repo.torch_mojo.wheels import LinuxX86WheelPackage, wheel_resource

from spack.package import *


class PyMojoCompiler(LinuxX86WheelPackage):
    """The Mojo compiler (`mojo`) and its standard library, as Modular ships
    them in wheels, installed into one prefix: the compiler finds its
    libraries next to itself. torch-mojo needs it to build its reduction
    kernels, not to run them. With +max, MAX's libraries too, with which
    Mojo compiles for GPUs (no GPU is needed to compile)."""

    homepage = "https://docs.modular.com/mojo/"
    pypi = "mojo-compiler/mojo_compiler-1.2.0-py3-none-manylinux_2_34_x86_64.whl"

    license("LicenseRef-Modular-Community-License")

    version(
        "1.2.0",
        sha256="3ee34a3b26c6cccaa9523a0e8db8f67bea954497d782d97c9e61c3c4ecbdac7b",
        expand=False,
    )

    variant("max", default=False, description="MAX's libraries, for compiling GPU code")

    depends_on("python@3.10:", type=("build", "run"))

    wheel_resource(
        "mojo-compiler-mojo-libs/mojo_compiler_mojo_libs-1.2.0-py3-none-any.whl",
        sha256="3d631f7e798c11d0029c4a892ebae1f5742751fac0c526af74b45a8ae07c3acb",
        when="@1.2.0",
    )
    # MAX 26.7.0 is the release that goes with Mojo 1.2.0.
    wheel_resource(
        "max-core/max_core-26.7.0-py3-none-manylinux_2_34_x86_64.whl",
        sha256="59bd4c95b0e41ae1f006f65ab6e6270413b84a673b9ffc7fb6849eaf67c4119a",
        when="@1.2.0 +max",
    )
    wheel_resource(
        "max-mojo-libs/max_mojo_libs-26.7.0-py3-none-any.whl",
        sha256="c9eeaef01a19565b8467da9c6b7cd57fa787759ce5954140b0e031d095c630b9",
        when="@1.2.0 +max",
    )
    wheel_resource(
        "max-shmem-libs/max_shmem_libs-26.7.0-py3-none-manylinux_2_34_x86_64.whl",
        sha256="73a2108a76974eb75b061a27b793343a0fdafeca620fe548933b09797b48a6b4",
        when="@1.2.0 +max",
    )
