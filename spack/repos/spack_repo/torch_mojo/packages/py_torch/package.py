# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
from spack_repo.builtin.packages.py_torch.package import PyTorch as BuiltinPyTorch

from spack.package import *


class PyTorch(BuiltinPyTorch):
    """PyTorch, as Spack's builtin package builds it, with the release
    torch-mojo is compiled against (2.13.0), which builtin does not have
    yet. Every other version, variant and dependency is builtin's."""

    # The commit the 2.13.0 release wheels were built from
    # (torch.version.git_version of torch 2.13.0).
    version("2.13.0", tag="v2.13.0", commit="cf30153c4c131c8164ee7798e5022d810682e2cb")
