"""`spack install py-torch-mojo` for real (`make spack-check`, about ten
minutes on 2 cores): Spack from ../shared/vendor (tests/spack_site.py), this
machine's compilers and build tools, a venv's torch as an external, the Mojo
wheels from a local source mirror. The installed package's modulefile,
loaded in a clean shell, trains 2 ranks. Also: the variant combinations
that cannot work are refused with the package's message, and the Mojo
toolchain of the GPU builds (py-mojo-compiler+max) compiles the GPU kernel.
"""

import json
import subprocess
import sys

import pytest

from tests import spack_site
from tests.harness import ROOT
from tests.test_modulefiles import lmod_shell, values
from tests.test_spack import ENVIRONMENTS

pytestmark = [pytest.mark.spack_install, pytest.mark.timeout(3600)]

# What a site asks for, and the package's answer.
REFUSED = {
    "py-torch-mojo+cuda+rocm cuda_arch=90 amdgpu_target=gfx942":
        "a build drives either AMD (+rocm) or NVIDIA (+cuda) GPUs, not both",
    "py-torch-mojo ccl=mojo": "ccl=mojo makes libmojoccl the library for GPU tensors, which needs its GPU kernel",
    "py-torch-mojo+cuda": "name the GPUs the kernel is compiled for: cuda_arch=90 (H100/H200)",
    "py-torch-mojo+cuda cuda_arch=70": "Mojo 1.2.0 cannot compile for sm_70",
    "py-torch-mojo+rocm amdgpu_target=gfx908": "Mojo 1.2.0 cannot compile for gfx908",
}


@pytest.fixture(scope="module")
def workstation(tmp_path_factory):
    reason = spack_site.missing()
    if reason:
        pytest.skip(reason)
    site = spack_site.Site().prepare()
    return spack_site.Workstation(site, tmp_path_factory.mktemp("workstation")).prepare()


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    """The checkout's files (tracked, and untracked but not ignored): Spack
    builds a develop spec in its source tree, and this one stays clean."""
    copy = tmp_path_factory.mktemp("source")
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout
    with open(copy / "source.tar", "wb") as archive:
        subprocess.run(["tar", "--null", "-T", "-", "-cf", "-"], input=files, cwd=ROOT, check=True, stdout=archive)
    subprocess.run(["tar", "-xf", "source.tar"], cwd=copy, check=True)
    (copy / "source.tar").unlink()
    return copy


@pytest.fixture(scope="module")
def solved(workstation, source_copy, tmp_path_factory):
    """Every solve of this module at once, two at a time: the refused
    specs, ccl=mojo in the H100 environment, the install's environment, and
    the install of the GPU toolchain."""
    site, scope = workstation.site, workstation.scope
    install_env = tmp_path_factory.mktemp("install-env")
    spack_site.write_yaml(install_env / "spack.yaml", {"spack": {
        "specs": ["py-torch-mojo"],
        "develop": {"py-torch-mojo": {"spec": "py-torch-mojo@=main", "path": str(source_copy)}},
        "view": False, "concretizer": {"unify": True}}})
    h100 = next(path for path in ENVIRONMENTS if path.parent.name == "h100-infiniband")
    h100_copy = spack_site.copy_environment(h100, tmp_path_factory.mktemp("h100"))
    commands = {spec: (("spec", *spec.split()), {"scopes": [scope]}) for spec in REFUSED}
    commands["ccl=mojo"] = (("-e", h100_copy, "spec", "--json", "py-torch-mojo+cuda cuda_arch=90 ccl=mojo"), {})
    commands["install env"] = (("-e", install_env, "concretize", "--fresh"), {"scopes": [scope]})
    commands["toolchain"] = (("install", "py-mojo-compiler+max"), {"scopes": [scope]})
    return site.run_all(commands), install_env


@pytest.mark.parametrize("spec", REFUSED)
def test_a_combination_that_cannot_work_is_refused(solved, spec):
    result = solved[0][spec]
    assert result.returncode != 0 and REFUSED[spec] in " ".join(result.stderr.split()), result.stderr[-3000:]


def test_ccl_mojo_concretizes_with_the_gpu_toolchain(solved):
    result = solved[0]["ccl=mojo"]
    assert result.returncode == 0, result.stderr[-3000:]
    nodes = {node["name"]: node for node in json.loads(result.stdout)["spec"]["nodes"]}
    assert nodes["py-torch-mojo"]["parameters"]["ccl"] == "mojo" and nodes["py-mojo-compiler"]["parameters"]["max"]


def test_the_gpu_toolchain_compiles_the_kernel(solved, workstation, tmp_path):
    result = solved[0]["toolchain"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    prefix = workstation.site.check("location", "-i", "py-mojo-compiler+max", scopes=[workstation.scope]).strip()
    for target, image, magic in (("sm_90", "reduce.ptx", b"//"), ("gfx942", "reduce.hsaco", b"\x7fELF")):
        # As the build runs it: the prefix's python packages on the path.
        compiled = subprocess.run(
            [f"{prefix}/bin/mojo", "run", "-D", f"TORCH_MOJO_GPU_TARGET={target}", str(ROOT / "kernels" / "gpu_emit.mojo"),
             str(tmp_path / image), str(tmp_path / "entry")],
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"),
                 "PYTHONPATH": f"{prefix}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"},
            capture_output=True, text=True, timeout=600)
        assert compiled.returncode == 0, compiled.stderr[-3000:]
        assert (tmp_path / image).read_bytes().startswith(magic) and (tmp_path / "entry").read_text().strip()


def test_spack_installs_it_and_its_module_trains_two_ranks(solved, workstation):
    results, install_env = solved
    assert results["install env"].returncode == 0, results["install env"].stderr[-3000:]
    site, scope = workstation.site, workstation.scope
    installed = site.spack("-e", install_env, "install", scopes=[scope], timeout=3600)
    assert installed.returncode == 0, installed.stdout[-6000:] + installed.stderr[-3000:]
    prefix = site.check("-e", install_env, "location", "-i", "py-torch-mojo", scopes=[scope]).strip()
    shell = lmod_shell(f"""
module use {prefix}/share/modulefiles
module load torch-mojo
echo "MODULE=$(module -t list 2>&1 | tr '\\n' ' ')"
echo "PACKAGE=$(python3 -c 'import torch_mojo; print(torch_mojo.__file__)')"
echo "LIBFABRIC=$(torch-mojo info --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["libfabric"]["source"])')"
cd {workstation.root}
torchrun --standalone --nproc-per-node=2 {ROOT}/examples/train_ddp.py
""", timeout=600)
    assert shell.returncode == 0, shell.stdout + shell.stderr
    seen = values(shell.stdout)
    assert seen["MODULE"].split() == ["torch-mojo/0.1.0"] and seen["PACKAGE"].startswith(prefix)
    assert seen["LIBFABRIC"].startswith("the site's libfabric")
    assert "backend mojo, world size 2, device cpu" in shell.stdout and "step 100  loss 0.1392" in shell.stdout
