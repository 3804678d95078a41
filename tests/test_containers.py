"""containers/: the Apptainer recipes, read as Apptainer reads a definition
file (a header of `Key: value` lines, then `%section`s; `{{ NAME }}` takes
%arguments' defaults or --build-arg), and their install step (install.sh,
what %post runs) run for real in a venv standing in for the image. No
container runtime and no vendor image can be reached here: the image
itself is not built, nor the plugin (its build fetches aws-ofi-nccl)."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.harness import ROOT
from torch_mojo import __version__, site_settings

CONTAINERS = ROOT / "containers"
RECIPES = sorted(CONTAINERS.glob("*.def"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# What each recipe is for: (its GPU library's plugin kind, the GPU vendor).
KINDS = {"torch-mojo-rocm": ("rocm", "amd"), "torch-mojo-ngc": ("cuda", "nvidia")}


def parse(path: Path) -> dict:
    """{"header": {key: value}, "sections": {name: [lines]}}, comments out."""
    header, sections, current = {}, {}, None
    for line in path.read_text().splitlines():
        if line.startswith("%"):
            current = sections.setdefault(line[1:].split()[0], [])
        elif current is not None:
            current.append(line.strip())
        elif line.strip() and not line.startswith("#"):
            key, _, value = line.partition(":")
            header[key.strip()] = value.strip()
    return {"header": header, "sections": {name: [line for line in lines if line and not line.startswith("#")]
                                           for name, lines in sections.items()}}


def arguments(recipe: dict) -> dict:
    return dict(line.split("=", 1) for line in recipe["sections"]["arguments"])


def expanded(text: str, recipe: dict) -> str:
    values = arguments(recipe)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda match: values[match.group(1)], text)


def environment(recipe: dict) -> dict:
    return dict(line.removeprefix("export ").split("=", 1) for line in recipe["sections"]["environment"])


def test_there_is_a_recipe_for_each_gpu_vendor():
    assert {path.stem for path in RECIPES} == set(KINDS)


@pytest.mark.parametrize("path", RECIPES, ids=lambda path: path.stem)
def test_recipe(path):
    recipe = parse(path)
    gpu, vendor = KINDS[path.stem]
    assert recipe["header"] == {"Bootstrap": "docker", "From": "{{ IMAGE }}"}
    assert set(recipe["sections"]) == {"arguments", "files", "post", "environment", "test", "labels", "help"}
    assert set(arguments(recipe)) == {"IMAGE", "GPU_TARGETS", "NET_PLUGIN_RELEASE", "NET_PLUGIN_LIBFABRIC"}
    # The source tree goes where %post installs it from; the plugin is built
    # for the image's GPUs into the directory %environment puts first.
    [files] = recipe["sections"]["files"]
    source = files.split()[1]
    post = [expanded(line, recipe).split() for line in recipe["sections"]["post"]]
    plugin_prefix = "/opt/aws-ofi-nccl"
    host_libs = "/opt/host-libs"
    assert post == [["sh", f"{source}/containers/build-net-plugin.sh", gpu, "v1.19.0", plugin_prefix, "/usr"],
                    ["mkdir", "-p", host_libs],
                    ["sh", f"{source}/containers/install.sh", source, arguments(recipe)["GPU_TARGETS"]]]
    for script in ("build-net-plugin.sh", "install.sh"):
        assert (CONTAINERS / script).exists()
    # The GPU kernel's default target is one the build compiles (and Spack's package allows).
    package = (ROOT / "spack" / "repos" / "spack_repo" / "torch_mojo" / "packages" / "py_torch_mojo" / "package.py")
    target = arguments(recipe)["GPU_TARGETS"]
    assert (f'"{target}"' if vendor == "amd" else f'"{target.removeprefix("sm_")}"') in package.read_text()
    # NCCL_NET is not forced: the plugin reaches the NICs only with the host's libfabric bound in.
    variables = environment(recipe)
    assert "NCCL_NET" not in variables and "NCCL_NET_PLUGIN" not in variables
    assert variables["LD_LIBRARY_PATH"] == f"{plugin_prefix}/lib:{host_libs}:${{LD_LIBRARY_PATH:-}}"
    # What sites publish for the GPUs on any network, as the table has it.
    for setting in site_settings.for_machine("slingshot", vendor):
        if setting.name in variables:
            assert variables[setting.name].replace("${USER:-user}", "$USER") == setting.value, setting.name
    help_text = "\n".join(recipe["sections"]["help"])
    for needed in ("srun --network=disable_rdzv_get", "flux run --setattr=rdzv_get_en=0", "--disable-rdzv-get",
                   f"--bind /opt/cray/libfabric/1.22.0/lib64/libfabric.so.1:{host_libs}/libfabric.so.1",
                   f"--bind /usr/lib64/libcxi.so.1:{host_libs}/libcxi.so.1", 'APPTAINERENV_NCCL_NET="AWS Libfabric"',
                   "--nccl-log", "--rocm" if vendor == "amd" else "--nv"):
        assert needed in help_text, needed
    # The image's own LD_LIBRARY_PATH is kept: the binds land in a directory on it.
    assert "--env LD_LIBRARY_PATH" not in help_text
    assert recipe["sections"]["test"] == ["python3 -m torch_mojo.cli info"]


def test_the_plugin_build_keeps_aws_platform_code_out_and_takes_the_hosts_libfabric():
    """build-net-plugin.sh's configure line, and its refusals, run for real
    (they come before anything that needs the network)."""
    script = (CONTAINERS / "build-net-plugin.sh").read_text()
    [configure] = [line for line in script.splitlines() if line.startswith("./configure")]
    for flag in ("--disable-platform-aws", '--with-libfabric="$LIBFABRIC"', '"$WITH_GPU"', "--disable-tests"):
        assert flag in configure.split(), flag

    def run(*args):
        return subprocess.run(["sh", str(CONTAINERS / "build-net-plugin.sh"), *args], capture_output=True, text=True,
                              timeout=30)

    wrong_gpu = run("metal", "v1.19.0", "/opt/aws-ofi-nccl")
    assert wrong_gpu.returncode == 2 and "GPU must be rocm or cuda, not metal" in wrong_gpu.stderr
    no_headers = run("rocm", "v1.19.0", "/opt/aws-ofi-nccl", "/nowhere")
    assert no_headers.returncode == 2 and "/nowhere/include/rdma/fabric.h is missing" in no_headers.stderr


def test_the_rocm_image_carries_the_torch_pyproject_names():
    """ROCm's tags name their torch; NGC's do not (install.sh checks it then)."""
    wanted = PYPROJECT["project"]["dependencies"]
    assert wanted == ["torch>=2.13,<2.14"]
    image = arguments(parse(CONTAINERS / "torch-mojo-rocm.def"))["IMAGE"]
    assert re.search(r"pytorch_release_2\.13\.\d+$", image), image


def test_the_install_step_refuses_an_image_with_another_torch(tmp_path):
    """install.sh's first step, against a torch of another release (a
    stand-in package that has only a version)."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('__version__ = "2.12.1+rocm7.1.1"\n')
    result = subprocess.run(["sh", str(CONTAINERS / "install.sh"), str(ROOT), "gfx942"], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable,
                                                         "PYTHONPATH": str(tmp_path)})
    assert result.returncode != 0
    assert ("this image has torch 2.12.1+rocm7.1.1; torch-mojo needs torch<2.14,>=2.13: build from an image "
            "with that torch (apptainer build --build-arg IMAGE=...)") in result.stderr


# Builds the package in a fresh venv, about four minutes: `make package-check`.
@pytest.mark.packaging
def test_the_install_step_runs_in_an_image_like_venv(tmp_path):
    """The ROCm recipe's %post install step, with a venv standing in for
    the image's Python: its torch (here the tests' own, through a .pth
    entry) stays, the build tools come at pyproject's versions, the GPU
    kernel is compiled for the recipe's default target."""
    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(image)], check=True, timeout=300)
    site_packages = next(image.glob("lib/python*/site-packages"))
    ours = next(Path(sys.executable).parent.parent.glob("lib/python*/site-packages"))
    (site_packages / "image-torch.pth").write_text(f"{ours}\n")
    recipe = parse(CONTAINERS / "torch-mojo-rocm.def")
    [install] = [expanded(line, recipe).split() for line in recipe["sections"]["post"] if "install.sh" in line]
    environ = {"HOME": os.environ.get("HOME", "/root"), "PYTHON": str(image / "bin" / "python"),
               "PATH": f"{image / 'bin'}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
               "SKBUILD_BUILD_DIR": str(ROOT / "build" / "container-test")}
    # The recipe copies the source tree to install.sh's first argument: here it stays where it is.
    command = ["sh", str(CONTAINERS / "install.sh"), str(ROOT), install[3]]
    result = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "as torch-mojo needs (torch<2.14,>=2.13)" in result.stdout
    assert f"torch-mojo {__version__}  ({site_packages}/torch_mojo)" in result.stdout
    assert re.search(r"GPU kernel for gfx942 \(MAX [\d.]+\)", result.stdout), result.stdout
