"""conda-recipe/: the recipe renders and validates with rattler-build (offline:
conda channels are out of reach here, so the package itself is not built),
and its build script and test commands run in a venv standing in for the
recipe's host environment."""

import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from rattler_build import Stage0Recipe, VariantConfig

from tests.harness import ROOT
from torch_mojo import __version__

RECIPE = ROOT / "conda-recipe"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BUILD_REQUIRES = {requirement.split(">")[0].split("=")[0]: requirement
                  for requirement in PYPROJECT["build-system"]["requires"]}


def rendered():
    recipe = Stage0Recipe.from_file(RECIPE / "recipe.yaml")
    return recipe.render(VariantConfig.from_file(str(RECIPE / "variants.yaml")))


def test_recipe_renders_one_package_per_python_version():
    variants = rendered()
    assert [variant.variant["python"] for variant in variants] == ["3.11", "3.12"]
    for variant in variants:
        recipe = variant.recipe
        assert (recipe.package.name, str(recipe.package.version)) == ("torch-mojo", PYPROJECT["project"]["version"])
        assert recipe.build.to_dict()["script"] == "build.sh"


def test_recipe_pins_what_pyproject_pins():
    """The versions the recipe asks for are pyproject.toml's, in conda's names."""
    assert PYPROJECT["project"]["version"] == __version__
    requirements = rendered()[0].recipe.requirements.to_dict()
    assert PYPROJECT["project"]["dependencies"] == ["torch>=2.13,<2.14"]
    assert "pytorch 2.13.*" in requirements["host"] and "pytorch 2.13.*" in requirements["run"]
    assert BUILD_REQUIRES["mojo"] == "mojo==1.2.0" and "mojo ==1.2.0" in requirements["host"]
    assert BUILD_REQUIRES["scikit-build-core"] == "scikit-build-core>=0.10"
    assert "scikit-build-core >=0.10" in requirements["host"]
    assert BUILD_REQUIRES["pybind11"] == "pybind11>=2.12" and "pybind11 >=2.12" in requirements["host"]
    assert "libfabric" in requirements["host"] and "libfabric" in requirements["run"]


def test_workstation_environment_matches_the_recipe():
    environment = yaml.safe_load((RECIPE / "environment.yml").read_text())
    requirements = rendered()[0].recipe.requirements.to_dict()
    wanted = {requirement for requirement in requirements["host"] + requirements["run"]
              if requirement.split()[0] not in ("python", "pip")}
    assert wanted <= set(environment["dependencies"])
    assert "conda-forge" in environment["channels"]


@pytest.fixture(scope="module")
def host_environment(tmp_path_factory):
    """A venv standing in for the recipe's host environment: torch, pybind11,
    scikit-build-core and Mojo come from the test's own environment (a .pth
    path entry), libfabric is the system's, and torch's torchrun command is
    there as pip would install it."""
    prefix = tmp_path_factory.mktemp("host")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    site_packages = next(prefix.glob("lib/python*/site-packages"))
    ours = next(Path(sys.executable).parent.parent.glob("lib/python*/site-packages"))
    (site_packages / "host-requirements.pth").write_text(f"{ours}\n")
    (prefix / "lib" / "libfabric.so.1").symlink_to(
        subprocess.run([sys.executable, "-c", "from torch_mojo import libraries; print(libraries.on_library_path"
                        "('libfabric.so.1'))"], capture_output=True, text=True, check=True).stdout.strip())
    torchrun = prefix / "bin" / "torchrun"
    torchrun.write_text(f"#!{prefix}/bin/python\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n")
    torchrun.chmod(0o755)
    return prefix


def in_host(prefix, command, **kwargs):
    environment = {
        "HOME": os.environ.get("HOME", "/root"),
        # The host environment first; the build tools (cmake, ninja, mojo) after it.
        "PATH": f"{prefix}/bin:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "PYTHON": f"{prefix}/bin/python", "PREFIX": str(prefix),
        # A build directory of its own: the development build is left alone.
        "SKBUILD_BUILD_DIR": str(ROOT / "build" / "conda-recipe-test"),
    }
    return subprocess.run(command, env=environment, capture_output=True, text=True, **kwargs)


# Builds the package a second time, about four minutes: `make package-check`.
@pytest.mark.packaging
def test_build_script_and_recipe_tests_run_in_the_host_environment(host_environment, tmp_path):
    prefix = host_environment
    python = f"{prefix}/bin/python"
    subprocess.run([python, "-m", "ensurepip", "--default-pip"], check=True, capture_output=True)
    built = in_host(prefix, ["bash", str(RECIPE / "build.sh")], cwd=ROOT, timeout=1500)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]

    tests = rendered()[0].recipe.to_dict()["tests"]
    for test in tests:
        if "python" in test:
            for module in test["python"]["imports"]:
                imported = in_host(prefix, [python, "-c", f"import {module}; print({module}.__file__)"], timeout=60)
                assert imported.returncode == 0 and str(prefix) in imported.stdout, imported.stderr
            checked = in_host(prefix, [python, "-m", "pip", "check"], timeout=120)
            assert checked.returncode == 0, checked.stdout + checked.stderr
        else:
            workdir = tmp_path / "test"
            for name in test["files"]["source"]:
                (workdir / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / name, workdir / name)
            script = "set -e\n" + "\n".join(test["script"])
            ran = in_host(prefix, ["bash", "-c", script], cwd=workdir, timeout=300)
            assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
            site_libfabric = f"{prefix}/lib/libfabric.so.1  (the site's libfabric (built with TORCH_MOJO_LIBFABRIC_LIBRARY))"
            assert site_libfabric in ran.stdout
            assert f"torch-mojo {__version__}  ({prefix}/lib/" in ran.stdout
            assert "backend mojo, world size 2" in ran.stdout and "step  20  loss" in ran.stdout
