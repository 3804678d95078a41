# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
from spack_repo.builtin.packages.compiler_wrapper.package import CompilerWrapper as BuiltinCompilerWrapper

from spack.package import *


class CompilerWrapper(BuiltinCompilerWrapper):
    """Spack's compiler wrapper, from the source archive the tests' Spack
    site has (a `git archive` of the v1.1.0 tag, whose checksum is not the
    release tarball's that builtin lists). Everything else is builtin's."""

    version("1.1.0", sha256="058d7a909e21e28c30fec6a874b6024c2598f58b284a96b8d96bb726ab0f9e75")
