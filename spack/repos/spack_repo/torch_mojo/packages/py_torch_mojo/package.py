# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
import os

from spack_repo.builtin.build_systems.cuda import CudaPackage
from spack_repo.builtin.build_systems.python import PythonPackage
from spack_repo.builtin.build_systems.rocm import ROCmPackage

from spack.package import *


class PyTorchMojo(PythonPackage, CudaPackage, ROCmPackage):
    """torch-mojo: the `mojo` torch.distributed backend for PyTorch. A c10d
    process group drives collectives through NCCL's C API: the site's RCCL
    or NCCL for GPU tensors, or libmojoccl, torch-mojo's own library (shared
    memory within a node, libfabric between nodes, reductions in Mojo)."""

    license("BSD-3-Clause")

    # No release has been published yet. The environments in spack/environments
    # build a checkout of the source tree (their `develop:` section); a site
    # that mirrors the repository can name it with packages.yaml's
    # `package_attributes: {git: ...}`.
    version("main")

    variant("libfabric", default=True, description="Record the site's libfabric for node-to-node collectives")
    variant(
        "ccl",
        default="vendor",
        values=("vendor", "mojo"),
        multi=False,
        description="Collective library for GPU tensors when TORCH_MOJO_BACKEND_CCL is unset: "
        "vendor (RCCL/NCCL) or mojo (libmojoccl)",
    )
    conflicts("+rocm", when="+cuda", msg="a build drives either AMD (+rocm) or NVIDIA (+cuda) GPUs")

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("python@3.10:", type=("build", "run"))
    depends_on("cmake@3.18:", type="build")
    depends_on("ninja", type="build")
    depends_on("py-scikit-build-core@0.10:", type="build")
    depends_on("py-pybind11@2.12:", type=("build", "link"))
    depends_on("nlohmann-json", type="build")
    # The kernels are compiled ahead of time: Mojo is needed to build only.
    depends_on("py-mojo-compiler@1.2.0", type="build")
    # MAX lets Mojo compile the GPU kernel for the build's GPU targets.
    depends_on("py-max-core@26.7.0", type="build", when="+cuda")
    depends_on("py-max-core@26.7.0", type="build", when="+rocm")

    # The C++ core is compiled against torch's C++ API: it runs only with
    # the torch it was built against.
    depends_on("py-torch@2.13+distributed", type=("build", "link", "run"))
    # On AMD, the CPU build of torch: a ROCm build of torch would load a
    # second HIP runtime next to the one RCCL uses.
    depends_on("py-torch~rocm~cuda", when="+rocm")
    depends_on("py-torch+cuda", when="+cuda")

    # libfabric's headers build the node-to-node transport, which loads the
    # library at run time; +libfabric also records the site's for that.
    depends_on("libfabric", type="build")
    depends_on("libfabric", when="+libfabric")
    with when("ccl=vendor"):
        # RCCL and NCCL for the GPUs this build targets.
        for target in ROCmPackage.amdgpu_targets:
            depends_on(f"rccl amdgpu_target={target}", when=f"+rocm amdgpu_target={target}")
        for arch in CudaPackage.cuda_arch_values:
            depends_on(f"nccl cuda_arch={arch}", when=f"+cuda cuda_arch={arch}")

    def config_settings(self, spec, prefix):
        """CMake options, through scikit-build-core: the site's libraries are
        recorded so that torch-mojo loads them first at run time."""
        settings = {
            "cmake.define.TORCH_MOJO_DEFAULT_CCL": spec.variants["ccl"].value,
            "cmake.define.TORCH_MOJO_GPU_TARGETS": ";".join(self.gpu_targets()),
        }
        if spec.satisfies("+libfabric"):
            settings["cmake.define.TORCH_MOJO_LIBFABRIC_LIBRARY"] = self.shared_library("libfabric", "libfabric.so.1")
        if spec.satisfies("^rccl"):
            settings["cmake.define.TORCH_MOJO_RCCL_LIBRARY"] = self.shared_library("rccl", "librccl.so.1")
        if spec.satisfies("^nccl"):
            settings["cmake.define.TORCH_MOJO_NCCL_LIBRARY"] = self.shared_library("nccl", "libnccl.so.2")
        return settings

    def gpu_targets(self):
        if self.spec.satisfies("+rocm"):
            return list(self.spec.variants["amdgpu_target"].value)
        if self.spec.satisfies("+cuda"):
            return [f"sm_{arch}" for arch in self.spec.variants["cuda_arch"].value]
        return []

    def shared_library(self, dependency, soname):
        for directory in self.spec[dependency].libs.directories:
            path = join_path(directory, soname)
            if os.path.exists(path):
                return path
        raise InstallError(f"{dependency} has no {soname} in {self.spec[dependency].libs.directories}")

    def setup_run_environment(self, env):
        if self.spec.satisfies("^libfabric fabrics=cxi"):
            env.set("MOJOCCL_FABRIC_PROVIDER", "cxi")

    @run_after("install")
    def write_modulefile(self):
        """An Lmod modulefile, torch-mojo/<version>.lua under
        <prefix>/share/modulefiles, that also puts the run dependencies
        (python, torch, ...) on the paths, for sites that do not use Spack's
        own module generation."""
        arguments = ["-m", "torch_mojo.cli", "modulefile", "--site", self.modulefile_site(),
                     "--output", join_path(self.prefix, "share", "modulefiles")]
        for dependency in self.spec.traverse(deptype="run", root=False):
            paths = {"PATH": dependency.prefix.bin,
                     "PYTHONPATH": join_path(dependency.prefix, self.spec["python"].package.platlib)}
            arguments += [f"--prepend-path={name}={path}" for name, path in paths.items() if os.path.isdir(path)]
        python(*arguments)

    def modulefile_site(self):
        # gfx942: the MI300 series, MI300A among them.
        if self.spec.satisfies("+rocm amdgpu_target=gfx942"):
            return "mi300a-slingshot"
        if self.spec.satisfies("+cuda cuda_arch=90"):
            return "h100-infiniband"
        return "generic"
