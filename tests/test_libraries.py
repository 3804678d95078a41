"""Which collective library accelerator tensors get, found in the user
guide's order, loaded by the same C++ loader the process group uses.

No GPU here, but libraries load without one: NVIDIA's NCCL wheel (installed
for these tests) answers ncclGetVersion, and a ROCm tree is laid out from
real files: libmojoccl, which answers NCCL's C API, stands in for
librccl.so.1, so the RCCL search finds, loads and asks a real library."""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torch_mojo import elf, libraries
from torch_mojo._paths import library_dir, mojoccl_path


def nccl_version_code(version: str) -> int:
    """NCCL's code for a version: 2.32.3 -> 23203."""
    major, minor, patch = (int(part) for part in version.split(".")[:3])
    return major * 10000 + minor * 100 + patch


def load_version(path, kind):
    import torch  # noqa: F401  (torch_mojo._C needs torch's libraries loaded)
    from torch_mojo import _C

    return _C._library_version(str(path), kind)


@pytest.fixture
def no_site_libraries(monkeypatch):
    for name in ("TORCH_MOJO_BACKEND_NCCL_LIB", "TORCH_MOJO_BACKEND_RCCL_LIB", "ROCM_PATH",
                 "TORCH_MOJO_BACKEND_CCL"):
        monkeypatch.delenv(name, raising=False)
    info = dict(libraries.build_info(), nccl_library="", rccl_library="", default_ccl="vendor")
    monkeypatch.setattr(libraries, "build_info", lambda: info)
    return monkeypatch


def rocm_tree(root: Path) -> Path:
    """<root>/lib with a HIP runtime and an RCCL that loads and answers."""
    lib = root / "lib"
    lib.mkdir(parents=True)
    kernels = Path(library_dir()) / "libtorch_mojo_kernels.so"
    shutil.copy(kernels, lib / "libamdhip64.so.6")  # any real library: only its path matters
    shutil.copy(mojoccl_path(), lib / "librccl.so.1")
    shutil.copy(kernels, lib / kernels.name)  # what librccl.so.1 (libmojoccl) links to
    return lib


# ------------------------------------------------------------------ NVIDIA

def test_the_nccl_wheel_is_found_and_answers_its_version(no_site_libraries):
    lookup = libraries.find_nccl()
    assert lookup.source == "an NCCL wheel (nvidia-nccl-cu12 or -cu13)"
    assert lookup.path.endswith("nvidia/nccl/lib/libnccl.so.2")
    assert libraries.accelerator_library("cuda") == (lookup.path, "nccl")
    expected = nccl_version_code(importlib.metadata.version("nvidia-nccl-cu12"))
    assert load_version(lookup.path, "nccl") == expected


def test_the_users_nccl_comes_first(no_site_libraries, tmp_path):
    chosen = tmp_path / "libnccl.so.2"
    shutil.copy(mojoccl_path(), chosen)
    no_site_libraries.setenv("TORCH_MOJO_BACKEND_NCCL_LIB", str(chosen))
    assert libraries.accelerator_library("cuda") == (str(chosen), "nccl")


def test_a_missing_nccl_says_what_to_install_on_nvidia(no_site_libraries):
    no_site_libraries.setenv("TORCH_MOJO_BACKEND_NCCL_LIB", "/nowhere/libnccl.so.2")
    with pytest.raises(RuntimeError) as caught:
        libraries.accelerator_library("cuda")
    message = str(caught.value)
    assert message.startswith("no NCCL/RCCL library found (TORCH_MOJO_BACKEND_NCCL_LIB="
                              "/nowhere/libnccl.so.2: no such file): this node's GPUs are NVIDIA")
    assert "nvidia-nccl-cu12" in message and "ROCM_PATH" not in message


def test_a_library_without_ncclapi_is_refused_by_name(tmp_path):
    fake = tmp_path / "libnccl.so.2"
    shutil.copy(Path(library_dir()) / "libtorch_mojo_kernels.so", fake)
    with pytest.raises(RuntimeError, match="has no ncclGetVersion: it is not a collective library"):
        load_version(fake, "nccl")


# --------------------------------------------------------------------- AMD

SEARCH_RCCL = """
import ctypes, json, os, sys
from torch_mojo import libraries
found = {}
found["before"] = libraries.find_rccl().to_dict()
ctypes.CDLL(sys.argv[1])  # as a ROCm build of torch or MAX loads its HIP runtime
found["hip loaded"] = libraries.find_rccl().to_dict()
print(json.dumps(found))
"""


def test_rccl_comes_from_the_rocm_whose_hip_runtime_is_loaded(tmp_path):
    loaded = rocm_tree(tmp_path / "rocm-loaded")
    configured = rocm_tree(tmp_path / "rocm-path")
    env = {key: value for key, value in os.environ.items() if key != "TORCH_MOJO_BACKEND_RCCL_LIB"}
    env["ROCM_PATH"] = str(configured.parent)
    out = subprocess.run([sys.executable, "-c", SEARCH_RCCL, str(loaded / "libamdhip64.so.6")],
                         env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    found = json.loads(out)
    assert found["before"]["path"] == str(configured / "librccl.so.1")
    assert found["before"]["source"] == "$ROCM_PATH/lib" and found["before"]["warning"] is None
    assert found["hip loaded"]["path"] == str(loaded / "librccl.so.1")
    assert found["hip loaded"]["source"] == "the ROCm whose HIP runtime is loaded"
    assert found["hip loaded"]["warning"] is None
    # Before the site's RCCL too: one HIP runtime matters more.
    assert found["before"]["searched"][:3] == [
        "TORCH_MOJO_BACKEND_RCCL_LIB", "the ROCm whose HIP runtime is loaded",
        "the site's RCCL (built with TORCH_MOJO_RCCL_LIBRARY)"]
    # What was found loads, with RCCL's name in messages and the [TRACE] line.
    assert load_version(found["hip loaded"]["path"], "rccl") == 100


def shared_library(path: Path, soname: str, needs: Path | None = None, runpath: str | None = None) -> Path:
    """A real shared library built here: its soname, the library it needs
    and the RUNPATH it finds it by, as ROCm's and Spack's are linked."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / f"{path.name}.c"
    source.write_text("int rocm_stand_in(void) { return 0; }\n")
    command = ["cc", "-shared", "-fPIC", "-o", str(path), str(source), f"-Wl,-soname,{soname}"]
    if needs:
        command += ["-Wl,--no-as-needed", f"-L{needs.parent}", f"-l:{needs.name}"]
    if runpath:
        command += ["-Wl,--enable-new-dtags", f"-Wl,-rpath,{runpath}"]
    subprocess.run(command, check=True, capture_output=True, timeout=60)
    return path


SECOND_RUNTIME = """
import ctypes, json, os, sys
from torch_mojo import libraries
ctypes.CDLL(sys.argv[1])  # the HIP runtime a ROCm build of torch loads
found = {}
for rccl in sys.argv[2:]:
    os.environ["TORCH_MOJO_BACKEND_RCCL_LIB"] = rccl
    found[rccl] = libraries.find_rccl().warning
print(json.dumps(found))
"""


def test_an_rccl_that_would_load_a_second_hip_runtime_is_named(tmp_path):
    """HIP and RCCL in different prefixes (as Spack installs them) share the
    loaded runtime when RCCL needs its soname; an RCCL of another ROCm
    that needs another libamdhip64 brings a second one, and is named."""
    hip6 = shared_library(tmp_path / "hip-6.4.3" / "lib" / "libamdhip64.so.6", "libamdhip64.so.6")
    spack_rccl = shared_library(tmp_path / "rccl-6.4.3" / "lib" / "librccl.so.1", "librccl.so.1", hip6,
                                runpath=str(hip6.parent))
    hip7 = shared_library(tmp_path / "rocm-7.1.1" / "lib" / "libamdhip64.so.7", "libamdhip64.so.7")
    rocm7_rccl = shared_library(tmp_path / "rocm-7.1.1" / "lib" / "librccl.so.1", "librccl.so.1", hip7,
                                runpath="$ORIGIN")
    assert elf.dynamic_section(str(spack_rccl)).needed[0] == "libamdhip64.so.6"
    env = {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}
    out = subprocess.run([sys.executable, "-c", SECOND_RUNTIME, str(hip6), str(spack_rccl), str(rocm7_rccl)],
                         env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    warnings = json.loads(out)
    assert warnings[str(spack_rccl)] is None
    assert warnings[str(rocm7_rccl)] == (
        f"{rocm7_rccl} (TORCH_MOJO_BACKEND_RCCL_LIB) loads another HIP runtime ({hip7}) than the one this process "
        f"has loaded ({hip6}): two HIP runtimes in one process can crash or hang; unset TORCH_MOJO_BACKEND_RCCL_LIB, "
        "or load the torch built for that ROCm")


def test_rccl_search_order_on_an_amd_node(no_site_libraries, tmp_path):
    kfd = tmp_path / "kfd"
    kfd.touch()
    no_site_libraries.setattr("torch_mojo.distributed._DEVICE_FILES", {"amd": [str(kfd)], "nvidia": []})
    lib = rocm_tree(tmp_path / "rocm")
    no_site_libraries.setenv("ROCM_PATH", str(lib.parent))
    assert libraries.accelerator_library("mojo") == (str(lib / "librccl.so.1"), "rccl")
    chosen = tmp_path / "mine" / "librccl.so.1"
    chosen.parent.mkdir()
    shutil.copy(lib / "librccl.so.1", chosen)
    no_site_libraries.setenv("TORCH_MOJO_BACKEND_RCCL_LIB", str(chosen))
    assert libraries.accelerator_library("mojo") == (str(chosen), "rccl")
    searched = libraries.find_rccl().searched
    assert searched[0] == "TORCH_MOJO_BACKEND_RCCL_LIB"


def test_a_missing_rccl_says_what_to_set_on_amd(no_site_libraries, tmp_path):
    if Path("/opt/rocm/lib/librccl.so.1").exists() or libraries.on_library_path("librccl.so.1"):
        pytest.skip("this machine has an RCCL installed")
    kfd = tmp_path / "kfd"
    kfd.touch()
    no_site_libraries.setattr("torch_mojo.distributed._DEVICE_FILES", {"amd": [str(kfd)], "nvidia": []})
    with pytest.raises(RuntimeError) as caught:
        libraries.accelerator_library("mojo")
    message = str(caught.value)
    assert message.startswith("no NCCL/RCCL library found (searched TORCH_MOJO_BACKEND_RCCL_LIB")
    assert "this node's GPUs are AMD" in message
    assert "ROCM_PATH" in message and "TORCH_MOJO_BACKEND_RCCL_LIB" in message
    assert "nvidia-nccl" not in message


def test_a_device_of_unknown_make_is_refused(no_site_libraries):
    no_site_libraries.setattr("torch_mojo.distributed._DEVICE_FILES", {"amd": [], "nvidia": []})
    for variable in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        no_site_libraries.delenv(variable, raising=False)
    with pytest.raises(RuntimeError, match="cannot tell who made the mojo device"):
        libraries.accelerator_library("mojo")


# ------------------------------------------------------------ libmojoccl

def test_torch_mojo_backend_ccl_mojo_uses_libmojoccl(no_site_libraries):
    no_site_libraries.setenv("TORCH_MOJO_BACKEND_CCL", "mojo")
    assert libraries.accelerator_library("cuda") == (mojoccl_path(), "mojoccl")


def test_without_an_accelerator_only_cpu_is_claimed():
    import torch

    from torch_mojo import _registration

    if torch.accelerator.current_accelerator() is not None:
        pytest.skip("this machine has an accelerator")
    assert libraries.current_accelerator() is None
    assert _registration._devices() == ["cpu"]


def test_info_reports_the_version_of_each_library(no_site_libraries):
    from torch_mojo import cli

    report = cli.info()
    cuda = report["collective_libraries"]["cuda"]
    assert cuda["version"] == nccl_version_code(importlib.metadata.version("nvidia-nccl-cu12"))
    assert report["collective_libraries"]["cpu"]["version"] == 100


def test_install_guide_lists_the_search_orders_the_code_uses(no_site_libraries):
    """The search stops at what it finds: with nothing to find, each lists
    every place it looks, which docs/install.md must show in that order."""
    no_site_libraries.setattr(libraries, "_nccl_wheels", lambda: [])
    no_site_libraries.setattr(libraries, "on_library_path", lambda soname: None)
    no_site_libraries.setattr(libraries, "loaded_hip_runtime", lambda: "/nowhere/libamdhip64.so.6")
    no_site_libraries.setenv("ROCM_PATH", "/nowhere")
    page = (Path(__file__).resolve().parent.parent / "docs" / "install.md").read_text()
    for lookup in (libraries.find_nccl(), libraries.find_rccl()):
        assert lookup.path is None or lookup.path.startswith("/opt/rocm"), lookup
        assert f"`{lookup.library}`: " + "; ".join(lookup.searched) + "." in page, lookup.searched
