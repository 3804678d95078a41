"""spack/: the package repository and the site environments.

With Spack (tests/spack_site.py, from ../shared/vendor): `spack audit` finds
nothing in our packages, `spack info` names where the source comes from,
and both site environments concretize as a site's would. Without it: every
CMake option the package passes is one of ours and CMake configures with the
values it would pass; every variant, environment variable and `torch-mojo
modulefile` option it names exists; the environments point at this source
tree and this repository. The install itself, the variants' conflicts and
the GPU toolchain are in tests/test_spack_install.py (`make spack-check`).
"""

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests import spack_site
from tests.harness import ROOT
from torch_mojo import env, site_settings
from torch_mojo.libraries import on_library_path

REPO = ROOT / "spack" / "repos" / "spack_repo" / "torch_mojo"
PACKAGE = REPO / "packages" / "py_torch_mojo" / "package.py"
ENVIRONMENTS = sorted((ROOT / "spack" / "environments").glob("*/spack.yaml"))
# Variants every CudaPackage / ROCmPackage has.
MIXIN_VARIANTS = {"cuda", "cuda_arch", "rocm", "amdgpu_target"}


def strings_in(path):
    return [node.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)
            and isinstance(node.value, str)]


def calls_in(path, function):
    """The first arguments of every call of `function` (string constants)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == function and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant):
                found.append(first.value)
            elif isinstance(first, ast.JoinedStr):  # f"...": its literal parts
                found.append("".join(part.value for part in first.values if isinstance(part, ast.Constant)))
    return found


def declared_variants(path):
    """{variant: allowed values or None} of a package.py, mixins included."""
    variants = {name: None for name in MIXIN_VARIANTS}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "variant":
            values = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "values"), None)
            variants[node.args[0].value] = values
    return variants


def own_variant_tokens(spec):
    """The variant tokens of a spec string that apply to the package itself
    (before any ^dependency)."""
    own = spec.split("^")[0]
    return re.findall(r"(?:(?<=\s)|^)([+~][a-z_]+|[a-z_]+=[\w.,]+)", own)


def check_tokens(spec, variants):
    for token in own_variant_tokens(spec):
        name, _, value = token.lstrip("+~").partition("=")
        assert name in variants, f"{spec!r}: py-torch-mojo has no variant {name!r}"
        allowed = variants[name]
        if value and allowed:
            assert value in allowed, f"{spec!r}: {name} takes {allowed}, not {value!r}"


def cmake_options():
    text = (ROOT / "CMakeLists.txt").read_text()
    return set(re.findall(r"^\s*set\((\w+) [^\n]*CACHE", text, re.M)) | set(re.findall(r"option\((\w+)", text))


def test_every_file_compiles():
    for path in REPO.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")


def test_repository_layout():
    repo = yaml.safe_load((REPO / "repo.yaml").read_text())["repo"]
    assert repo["namespace"] == REPO.name and repo["api"].startswith("v2.")
    for package in (REPO / "packages").iterdir():
        class_name = "".join(part.capitalize() for part in package.name.split("_"))
        assert f"class {class_name}(" in (package / "package.py").read_text(), package.name


def test_the_cmake_options_it_passes_are_ours():
    passed = {match[len("cmake.define."):] for match in strings_in(PACKAGE) if match.startswith("cmake.define.")}
    assert passed == {"TORCH_MOJO_DEFAULT_CCL", "TORCH_MOJO_GPU_TARGETS", "TORCH_MOJO_LIBFABRIC_LIBRARY",
                      "TORCH_MOJO_RCCL_LIBRARY", "TORCH_MOJO_NCCL_LIBRARY"}
    assert passed <= cmake_options(), passed - cmake_options()


def configure(tmp_path, *defines):
    """A configure-only CMake run of the library (no torch), as a Spack build
    would start it."""
    command = ["cmake", "-S", str(ROOT), "-B", str(tmp_path), "-DTORCH_MOJO_BUILD_BACKEND=OFF",
               f"-DPython_EXECUTABLE={sys.executable}", *defines]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_cmake_configures_with_what_the_package_passes_and_records_it(tmp_path):
    libfabric = on_library_path("libfabric.so.1")
    result = configure(tmp_path, "-DTORCH_MOJO_DEFAULT_CCL=mojo", "-DTORCH_MOJO_GPU_TARGETS=gfx942",
                       f"-DTORCH_MOJO_LIBFABRIC_LIBRARY={libfabric}")
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = json.loads((tmp_path / "build_info.json").read_text())
    assert recorded["default_ccl"] == "mojo" and recorded["gpu_targets"] == "gfx942"
    assert recorded["libfabric_library"] == libfabric and recorded["rccl_library"] == ""


@pytest.mark.parametrize("define, message", [
    ("-DTORCH_MOJO_RCCL_LIBRARY=/nowhere/librccl.so.1",
     "TORCH_MOJO_RCCL_LIBRARY=/nowhere/librccl.so.1: no such file; give the library's absolute path"),
    ("-DTORCH_MOJO_DEFAULT_CCL=nccl", "TORCH_MOJO_DEFAULT_CCL=nccl: expected vendor or mojo"),
])
def test_cmake_refuses_bad_site_options(tmp_path, define, message):
    result = configure(tmp_path, define)
    assert result.returncode != 0 and message in " ".join(result.stderr.split())  # CMake wraps lines


def test_the_variants_it_names_exist():
    variants = declared_variants(PACKAGE)
    assert variants["ccl"] == ("vendor", "mojo")
    conditions = [*calls_in(PACKAGE, "satisfies")]
    for node in ast.walk(ast.parse(PACKAGE.read_text())):
        if isinstance(node, ast.Call):
            conditions += [keyword.value.value for keyword in node.keywords
                           if keyword.arg == "when" and isinstance(keyword.value, ast.Constant)]
    assert conditions
    for condition in conditions:
        check_tokens(condition, variants)


def test_the_variables_it_sets_exist():
    for name in calls_in(PACKAGE, "set"):
        if name.startswith(env.PREFIXES):
            assert name in env.BY_NAME, name
    for path in ENVIRONMENTS:
        modules = yaml.safe_load(path.read_text())["spack"].get("modules", {})
        for settings in modules.get("default", {}).get("lmod", {}).values():
            if isinstance(settings, dict):
                for name in settings.get("environment", {}).get("set", {}):
                    assert name in env.BY_NAME, f"{path}: {name}"


def test_the_modulefile_it_writes_uses_real_options(tmp_path):
    """The install runs `torch-mojo modulefile` with the network and GPU
    vendor of the spec (names site_settings knows) and the plugin's lib."""
    source = PACKAGE.read_text()
    returned = set(re.findall(r'return "([a-z]+)"', source.split("def network")[1].split("def net_plugin")[0]))
    returned |= set(re.findall(r'"(amd|nvidia|none)"', source.split("def gpu_vendor")[1].split("def ")[0]))
    assert returned == set(site_settings.NETWORKS) | set(site_settings.GPUS)
    for option in ("--network", "--gpu", "--net-plugin", "--output", "--prepend-path="):
        assert f'"{option}' in source
    # The command the install runs, with a dependency's paths and a plugin.
    plugin = tmp_path / "aws-ofi-nccl" / "lib"
    plugin.mkdir(parents=True)
    (plugin / "librccl-net.so").write_bytes(b"")
    result = subprocess.run([sys.executable, "-m", "torch_mojo.cli", "modulefile", "--network", "slingshot",
                             "--gpu", "amd", "--net-plugin", str(plugin), "--output", str(tmp_path),
                             "--prepend-path=PATH=/spack/opt/python/bin",
                             "--prepend-path=PYTHONPATH=/spack/opt/py-torch/lib/python3.11/site-packages"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    text = next(tmp_path.glob("torch-mojo/*.lua")).read_text()
    assert 'prepend_path("PYTHONPATH", "/spack/opt/py-torch/lib/python3.11/site-packages")' in text
    assert f'prepend_path("LD_LIBRARY_PATH", "{plugin}")' in text and 'pushenv("NCCL_NET", "AWS Libfabric")' in text


def test_the_versions_it_pins_are_pyprojects():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mojo = next(r for r in pyproject["build-system"]["requires"] if r.startswith("mojo==")).split("==")[1]
    text = PACKAGE.read_text()
    assert f'MOJO_VERSION = "{mojo}"' in text and 'depends_on(f"py-mojo-compiler@{MOJO_VERSION}", type="build")' in text
    assert pyproject["project"]["dependencies"] == ["torch>=2.13,<2.14"] and '"py-torch@2.13+distributed"' in text
    # The Mojo wheels, and MAX's for the GPU kernel: the versions the
    # development environment uses.
    compiler = (REPO / "packages" / "py_mojo_compiler" / "package.py").read_text()
    pypi = re.search(r'pypi = "([^"]+)"', compiler).group(1)
    assert pypi.split("/")[1].split("-")[1] == mojo and re.search(rf'version\(\s*"{re.escape(mojo)}"', compiler)
    max_core = re.search(r"^max-core==(\S+)", (ROOT / "requirements-dev.txt").read_text(), re.M).group(1)
    wheels = dict(re.findall(r'"([a-z-]+)/[a-z_]+-([0-9.]+)-[^"]*\.whl"', compiler))
    assert wheels == {"mojo-compiler": mojo, "mojo-compiler-mojo-libs": mojo, "max-core": max_core,
                      "max-mojo-libs": max_core, "max-shmem-libs": max_core}


@pytest.mark.parametrize("path", ENVIRONMENTS, ids=lambda path: path.parent.name)
def test_site_environment(path):
    spack = yaml.safe_load(path.read_text())["spack"]
    ours = [spec for spec in spack["specs"] if spec.startswith("py-torch-mojo")]
    assert len(ours) == 1
    check_tokens(ours[0], declared_variants(PACKAGE))
    develop = spack["develop"]["py-torch-mojo"]
    assert (path.parent / develop["path"]).resolve() == ROOT.resolve()
    assert develop["spec"] == "py-torch-mojo@=main" and 'version("main", branch="main")' in PACKAGE.read_text()
    repository = Path(spack["repos"]["torch_mojo"].replace("$env", str(path.parent)))
    assert (repository / "repo.yaml").exists()
    for name, settings in spack["packages"].items():
        for external in settings.get("externals", []):
            assert external["spec"].split("@")[0] == name and external["prefix"].startswith("/"), name


# ---------------------------------------------------------------- with Spack
# The first command of a new site indexes builtin (two to three minutes);
# each environment's solve takes about two minutes of one core.
def with_spack(test):
    """About four minutes of solving on 2 cores in all: `make package-check`,
    not `make test`."""
    return pytest.mark.packaging(pytest.mark.timeout(1200)(test))


@pytest.fixture(scope="module")
def site():
    reason = spack_site.missing()
    if reason:
        pytest.skip(reason)
    return spack_site.Site().prepare()


@with_spack
def test_spack_audit_finds_nothing_in_our_packages(site):
    packages = [path.parent.name.replace("_", "-") for path in (REPO / "packages").glob("*/package.py")]
    result = site.spack("audit", "packages", *packages)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ": passed" in result.stdout and "error" not in result.stdout.lower(), result.stdout


@with_spack
def test_spack_info_names_the_source(site):
    info = site.check("info", "py-torch-mojo")
    assert "main    [git] https://github.com/torch-mojo/torch-mojo.git on branch main" in info
    torch = site.check("info", "py-torch")
    assert "2.13.0    [git] https://github.com/pytorch/pytorch.git at commit cf30153c" in torch
    assert "Preferred version:  \n    2.13.0" in torch


def on_rocm_6(copy: Path) -> Path:
    """The MI300A environment on ROCm 6.4.3 (a site that has not moved to
    ROCm 7): every ROCm external, and the plugin built for it."""
    data = yaml.safe_load((copy / "spack.yaml").read_text())
    for settings in data["spack"]["packages"].values():
        for external in settings.get("externals", []):
            external["spec"] = external["spec"].replace("@7.1.1", "@6.4.3")
            external["prefix"] = external["prefix"].replace("rocm-7.1.1", "rocm-6.4.3")
    spack_site.write_yaml(copy / "spack.yaml", data)
    return copy


@pytest.fixture(scope="module")
def concretized(site, tmp_path_factory):
    """The site environments, and the MI300A one on ROCm 6, concretized
    two at a time (about two minutes of one core each), as copies that
    point at this checkout."""
    copies = {path.parent.name: spack_site.copy_environment(path, tmp_path_factory.mktemp(path.parent.name))
              for path in ENVIRONMENTS}
    copies["mi300a-slingshot-rocm6"] = on_rocm_6(spack_site.copy_environment(
        ROOT / "spack" / "environments" / "mi300a-slingshot" / "spack.yaml", tmp_path_factory.mktemp("rocm6")))
    results = site.run_all({name: (("-e", copy, "concretize", "--fresh"), {}) for name, copy in copies.items()})
    return {name: (results[name], copy) for name, copy in copies.items()}


def solved(concretized, name: str) -> spack_site.Lock:
    """The environment `name` as it concretized, which it must have."""
    result, copy = concretized[name]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return spack_site.Lock(copy)


@with_spack
def test_the_mi300a_environment_concretizes(concretized):
    lock = solved(concretized, "mi300a-slingshot")
    assert lock.variant("py-torch-mojo", "rocm") and lock.variant("py-torch-mojo", "amdgpu_target") == ["gfx942"]
    # ROCm's torch for the same GPU, on the site's one HIP and RCCL (one
    # node each, both the site's, shared by torch and torch-mojo).
    assert lock.variant("py-torch", "rocm") and lock.variant("py-torch", "amdgpu_target") == ["gfx942"]
    assert not lock.variant("py-torch-mojo", "cpu_torch") and not lock.variant("py-torch", "cuda")
    for shared in ("hip", "rccl"):
        assert lock.node(shared)["external"] and shared in lock.dependencies("py-torch") & lock.dependencies(
            "py-torch-mojo")
    assert lock.variant("rccl", "amdgpu_target") == ["gfx942"] and lock.node("hip")["version"] == "7.1.1"
    # RCCL's libfabric plugin for ROCm 7 on Slingshot: aws-ofi-nccl built for ROCm.
    assert "aws-ofi-nccl" in lock.dependencies("py-torch-mojo") and lock.node("aws-ofi-nccl")["external"]
    assert lock.variant("aws-ofi-nccl", "rocm") and not lock.variant("aws-ofi-nccl", "cuda")
    assert lock.variant("py-mojo-compiler", "max")
    assert lock.target("py-torch-mojo") == "zen4" and lock.node("gcc")["version"] == "13.2.0"
    assert {"libfabric", "py-torch", "py-mojo-compiler"} <= lock.dependencies("py-torch-mojo")


@with_spack
def test_on_rocm_6_the_plugin_is_aws_ofi_nccl_too(concretized):
    lock = solved(concretized, "mi300a-slingshot-rocm6")
    assert lock.node("hip")["version"] == "6.4.3" and lock.variant("py-torch", "rocm")
    assert "aws-ofi-nccl" in lock.dependencies("py-torch-mojo") and lock.variant("aws-ofi-nccl", "rocm")
    assert not lock.has("aws-ofi-rccl")


@with_spack
def test_the_h100_environment_concretizes(concretized):
    lock = solved(concretized, "h100-infiniband")
    assert lock.variant("py-torch-mojo", "cuda") and lock.variant("py-torch-mojo", "cuda_arch") == ["90"]
    # torch and NCCL built for the same GPUs as torch-mojo's kernel.
    assert lock.variant("py-torch", "cuda") and lock.variant("py-torch", "cuda_arch") == ["90"]
    assert lock.variant("nccl", "cuda_arch") == ["90"] and lock.node("nccl")["external"]
    assert lock.node("py-torch")["version"] == "2.13.0" and lock.variant("py-mojo-compiler", "max")
    # NCCL's own InfiniBand transport: no plugin.
    assert not lock.has("aws-ofi-nccl")


@with_spack
def test_the_h100_slingshot_environment_builds_the_plugin_for_nccl(concretized):
    lock = solved(concretized, "h100-slingshot")
    assert lock.variant("py-torch-mojo", "cuda") and lock.variant("py-torch", "cuda_arch") == ["90"]
    # aws-ofi-nccl 1.19.0 from its release, built by Spack against the
    # site's NCCL (fabrics=auto), libfabric (cxi) and cray-mpich.
    plugin = lock.node("aws-ofi-nccl")
    assert plugin["version"] == "1.19.0" and not plugin.get("external")
    assert lock.variant("aws-ofi-nccl", "cuda") and not lock.variant("aws-ofi-nccl", "rocm")
    assert {"nccl", "libfabric", "cray-mpich"} <= lock.dependencies("aws-ofi-nccl")
    assert lock.variant("nccl", "fabrics") == ["auto"] and lock.node("nccl")["external"]
    assert lock.variant("libfabric", "fabrics") == ["cxi"]
