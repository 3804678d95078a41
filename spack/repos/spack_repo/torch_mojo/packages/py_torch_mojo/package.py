# Copyright torch-mojo contributors. SPDX-License-Identifier: BSD-3-Clause
import os

from spack_repo.builtin.build_systems.cuda import CudaPackage
from spack_repo.builtin.build_systems.python import PythonPackage
from spack_repo.builtin.build_systems.rocm import ROCmPackage

from spack.package import *

# The Mojo compiler the kernels are built with, and the GPU architectures
# for which it compiles torch-mojo's GPU kernel (each of Spack's tried).
MOJO_VERSION = "1.2.0"
MOJO_CUDA_ARCHS = ("52", "60", "61", "75", "80", "86", "87", "89", "90", "90a", "100", "100a", "103", "103a",
                   "110", "110a", "120", "120a", "121", "121a")
MOJO_AMDGPU_TARGETS = ("gfx90a", "gfx942", "gfx950", "gfx1030", "gfx1100", "gfx1101", "gfx1102", "gfx1103",
                       "gfx1150", "gfx1151", "gfx1152", "gfx1200", "gfx1201", "gfx1250")


class PyTorchMojo(PythonPackage, CudaPackage, ROCmPackage):
    """torch-mojo: the `mojo` torch.distributed backend for PyTorch. A c10d
    process group drives collectives through NCCL's C API: the site's RCCL
    or NCCL for GPU tensors, or libmojoccl, torch-mojo's own library (shared
    memory within a node, libfabric between nodes, reductions in Mojo)."""

    homepage = "https://github.com/torch-mojo/torch-mojo"
    git = "https://github.com/torch-mojo/torch-mojo.git"

    license("BSD-3-Clause")

    # No release has been published yet: `main` is the development branch.
    # The environments in spack/environments build the checkout they sit in
    # instead (their `develop:` section).
    version("main", branch="main")

    variant("libfabric", default=True, description="Record the site's libfabric for node-to-node collectives")
    variant(
        "ccl",
        default="vendor",
        values=("vendor", "mojo"),
        multi=False,
        description="Collective library for GPU tensors when TORCH_MOJO_BACKEND_CCL is unset: "
        "vendor (RCCL/NCCL) or mojo (libmojoccl)",
    )
    conflicts("+rocm", when="+cuda", msg="a build drives either AMD (+rocm) or NVIDIA (+cuda) GPUs, not both")
    conflicts("ccl=mojo", when="~cuda~rocm",
              msg="ccl=mojo makes libmojoccl the library for GPU tensors, which needs its GPU kernel: "
              "add +cuda cuda_arch=... or +rocm amdgpu_target=...")
    # The Mojo compiler's wheels are manylinux_2_34 x86_64 builds: it does
    # not run on an older glibc (RHEL 8, SLES 15), though what it compiles
    # (libtorch_mojo_kernels.so, GPU kernel images) needs no glibc at all.
    conflicts("^glibc@:2.33",
              msg="the Mojo compiler that builds torch-mojo's kernels needs glibc 2.34 or newer (RHEL 9, "
              "Ubuntu 22.04, Debian 12): build in a container (containers/), or compile the kernels on such a "
              "machine and pass them with pip (TORCH_MOJO_KERNELS_LIBRARY, TORCH_MOJO_GPU_KERNELS_DIR; "
              "docs/install.md)")
    conflicts("cuda_arch=none", when="+cuda",
              msg="name the GPUs the kernel is compiled for: cuda_arch=90 (H100/H200), 80 (A100), ...")
    # The GPU kernel is compiled with Mojo, which knows these architectures.
    for arch in CudaPackage.cuda_arch_values:
        if arch not in MOJO_CUDA_ARCHS:
            conflicts(f"cuda_arch={arch}", when="+cuda",
                      msg=f"Mojo {MOJO_VERSION} cannot compile for sm_{arch}: "
                      f"cuda_arch takes {', '.join(MOJO_CUDA_ARCHS)}")
    for target in ROCmPackage.amdgpu_targets:
        if target.split(":")[0] not in MOJO_AMDGPU_TARGETS:
            conflicts(f"amdgpu_target={target}", when="+rocm",
                      msg=f"Mojo {MOJO_VERSION} cannot compile for {target}: "
                      f"amdgpu_target takes {', '.join(MOJO_AMDGPU_TARGETS)}")

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("python@3.10:", type=("build", "run"))
    depends_on("cmake@3.18:", type="build")
    depends_on("ninja", type="build")
    depends_on("py-scikit-build-core@0.10:", type="build")
    depends_on("py-pybind11@2.12:", type=("build", "link"))
    depends_on("nlohmann-json", type="build")
    # The kernels are compiled ahead of time: Mojo is needed to build only.
    depends_on(f"py-mojo-compiler@{MOJO_VERSION}", type="build")
    # MAX lets Mojo compile the GPU kernel for the build's GPU targets.
    depends_on("py-mojo-compiler+max", type="build", when="+cuda")
    depends_on("py-mojo-compiler+max", type="build", when="+rocm")

    # The C++ core is compiled against torch's C++ API: it runs only with
    # the torch it was built against.
    depends_on("py-torch@2.13+distributed", type=("build", "link", "run"))
    # On GPU nodes, torch built for the same GPUs: with the hip and rccl (or
    # cuda and nccl) nodes of this build, so one HIP runtime serves torch
    # and RCCL. +cpu_torch takes torch's CPU build instead, where a user
    # asks for it (the GPUs then reached only through MAX's mojo device).
    variant("cpu_torch", default=False, when="+rocm", description="the CPU build of torch on AMD GPU nodes")
    variant("cpu_torch", default=False, when="+cuda", description="the CPU build of torch on NVIDIA GPU nodes")
    depends_on("py-torch~rocm~cuda", when="+cpu_torch")
    for target in ROCmPackage.amdgpu_targets:
        depends_on(f"py-torch+rocm amdgpu_target={target}", when=f"+rocm amdgpu_target={target} ~cpu_torch")
    for arch in CudaPackage.cuda_arch_values:
        depends_on(f"py-torch+cuda cuda_arch={arch}", when=f"+cuda cuda_arch={arch} ~cpu_torch")

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
        # On Slingshot RCCL and NCCL reach the NICs only through libfabric's
        # net plugin: without it they use sockets between nodes, silently
        # and many times slower. aws-ofi-nccl, built for the GPUs, on ROCm
        # 6 and 7 alike (HPE's RCCL guide builds 1.19; aws-ofi-rccl has
        # only git branches, no release to build again) and for NVIDIA
        # GPUs (where it asks for an NCCL built with fabrics=auto).
        with when("^libfabric fabrics=cxi"):
            depends_on("aws-ofi-nccl@1.19: +rocm ~cuda", type="run", when="+rocm")
            depends_on("aws-ofi-nccl@1.19: +cuda ~rocm", type="run", when="+cuda")

    def config_settings(self, spec, prefix):
        """CMake options, through scikit-build-core: the site's libraries are
        recorded so that torch-mojo loads them first at run time."""
        settings = {
            "cmake.define.TORCH_MOJO_DEFAULT_CCL": spec.variants["ccl"].value,
            # "none": no GPU kernel, even where MAX is importable.
            "cmake.define.TORCH_MOJO_GPU_TARGETS": ";".join(self.gpu_targets()) or "none",
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
            # Mojo names the architecture alone (gfx90a, not gfx90a:xnack-).
            return sorted({target.split(":")[0] for target in self.spec.variants["amdgpu_target"].value})
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
        # For Spack's own modules: libmojoccl's provider between nodes. The
        # modulefile the install writes sets every published setting.
        provider = {"slingshot": "cxi", "infiniband": "verbs"}.get(self.network())
        if provider:
            env.set("MOJOCCL_FABRIC_PROVIDER", provider)

    @run_after("install")
    def write_modulefile(self):
        """An Lmod modulefile, torch-mojo/<version>.lua under
        <prefix>/share/modulefiles, with the settings sites publish for the
        network and GPUs of this build, RCCL/NCCL's libfabric plugin, and
        the run dependencies (python, torch, ...) on the paths, for sites
        that do not use Spack's own module generation."""
        arguments = ["-m", "torch_mojo.cli", "modulefile", "--network", self.network(), "--gpu", self.gpu_vendor(),
                     "--output", join_path(self.prefix, "share", "modulefiles")]
        plugin = self.net_plugin()
        if plugin:
            arguments += ["--net-plugin", self.spec[plugin].prefix.lib]
        platlib = self.spec["python"].package.platlib
        for dependency in self.spec.traverse(deptype="run", root=False):
            paths = {"PATH": dependency.prefix.bin, "PYTHONPATH": join_path(dependency.prefix, platlib)}
            arguments += [f"--prepend-path={name}={path}" for name, path in paths.items() if os.path.isdir(path)]
        # The command describes the installation it runs from: this one.
        own_first = os.pathsep.join(filter(None, [join_path(self.prefix, platlib), os.environ.get("PYTHONPATH")]))
        python(*arguments, extra_env={"PYTHONPATH": own_first})

    def network(self):
        """The network between nodes, as libfabric's fabrics tell it."""
        if self.spec.satisfies("^libfabric fabrics=cxi"):
            return "slingshot"
        if self.spec.satisfies("^libfabric fabrics=verbs"):
            return "infiniband"
        return "ethernet"

    def gpu_vendor(self):
        return "amd" if self.spec.satisfies("+rocm") else "nvidia" if self.spec.satisfies("+cuda") else "none"

    def net_plugin(self):
        return "aws-ofi-nccl" if self.spec.satisfies("^aws-ofi-nccl") else None
