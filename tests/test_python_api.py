"""The Python face of torch-mojo: registration, use_local_rank_gpu, the
environment table and its checks, the CLI."""

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.harness import ROOT, run_worker
from torch_mojo import env
from torch_mojo.distributed import use_local_rank_gpu


def python(code, **env_vars):
    import os

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, **env_vars}, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_importing_has_no_side_effects():
    out = python(
        "import sys, torch_mojo, torch_mojo.distributed\n"
        "print('torch' in sys.modules)\n"
        "import torch.distributed as dist\n"
        "print(dist.get_default_backend_for_device('cpu'))"
    )
    assert out.split() == ["False", "gloo"]


def test_register_makes_mojo_the_default_for_cpu_and_is_idempotent():
    out = python(
        "import torch_mojo, torch.distributed as dist\n"
        "torch_mojo.register_mojo_devices(); torch_mojo.register_mojo_devices()\n"
        "print(dist.get_default_backend_for_device('cpu'), dist.Backend.MOJO)"
    )
    assert out.split() == ["mojo", "mojo"]


def test_init_process_group_without_a_backend_uses_mojo():
    (result,) = run_worker("init_only", 1)
    assert "backend cpu:mojo sum [1.0, 1.0, 1.0]" in result.stdout
    assert re.search(r"\[TRACE\] collectives via /\S+/libmojoccl\.so \(mojoccl version 100\)", result.stderr)


def test_trace_line_can_be_hidden():
    results = run_worker("init_only", 2, env={"TORCH_MOJO_BACKEND_TRACE": "0"})
    assert all("[TRACE]" not in result.stderr for result in results)


# ------------------------------------------------------------- environment

def test_unknown_variables_are_warned_about_with_the_closest_name():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        notes = env.check_environment({"MOJOCCL_ALGOO": "auto", "TORCH_MOJO_BACKEND_TRAC": "0",
                                       "MOJOCCL_WHATEVER": "1", "OTHER": "x"})
    assert "MOJOCCL_ALGOO is not a torch-mojo variable and has no effect; did you mean MOJOCCL_ALGO?" in notes
    assert any("did you mean TORCH_MOJO_BACKEND_TRACE?" in note for note in notes)
    assert any(note.startswith("MOJOCCL_WHATEVER") and "did you mean" not in note for note in notes)
    assert len(caught) == 3


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("TORCH_MOJO_BACKEND_TRACE", "yes", "TORCH_MOJO_BACKEND_TRACE=yes is not valid: expected one of 0, 1"),
        ("MOJOCCL_BOOTSTRAP_TIMEOUT_S", "-3", "expected an integer from 1 to 86400"),
        ("MOJOCCL_ALGO", "ring2", "expected one of auto, one_shot, two_shot"),
        ("MOJOCCL_NET_ALGO", "ring,star",
         "MOJOCCL_NET_ALGO=ring,star is not valid: expected auto, or a comma-separated list of ring, "
         "recursive_doubling, rabenseifner, tree"),
    ],
)
def test_bad_values_raise_naming_the_variable(name, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        env.check_environment({name: value})


def test_a_list_variable_takes_any_list_of_its_items():
    for value in ("auto", "ring", "recursive_doubling,ring", "rabenseifner", "tree,rabenseifner"):
        assert env.check_environment({"MOJOCCL_NET_ALGO": value}) == []


def test_register_checks_the_environment():
    result = subprocess.run(
        [sys.executable, "-c", "import torch_mojo; torch_mojo.register_mojo_devices()"],
        capture_output=True, text=True, env={"PATH": "/usr/bin", "MOJOCCL_ALGO": "fast", "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode != 0 and "MOJOCCL_ALGO=fast is not valid" in result.stderr


def test_every_variable_the_code_reads_is_in_the_table():
    names = set()
    for path in [*ROOT.glob("cpp/**/*.cc"), *ROOT.glob("cpp/**/*.h"), *ROOT.glob("python/**/*.py")]:
        names.update(re.findall(r'"((?:MOJOCCL|TORCH_MOJO_BACKEND|TORCH_NCCL|TORCH_FR|TORCH_INCLUDE)_[A-Z0-9_]+)"',
                                path.read_text()))
    names.discard("TORCH_MOJO_BACKEND_")  # the prefix itself
    unknown = names - set(env.BY_NAME)
    assert not unknown, f"read by the code but missing from torch_mojo/env.py: {unknown}"
    used = {variable.name for variable in env.VARIABLES if variable.used}
    # torch's flight recorder reads the buffer size itself.
    unread = used - names - {"TORCH_FR_BUFFER_SIZE"}
    assert not unread, f"marked used in env.py but read nowhere: {unread}"


def test_libmojoccls_table_of_settings_agrees_with_envs():
    """libmojoccl states each variable it reads once, with its default and
    what it accepts (cpp/ccl/base/settings.cc); env.py, from which the docs and
    the doctor follow, must say the same."""
    from torch_mojo.mojoccl import Library

    table = Library().settings()
    ours = {variable.name for variable in env.VARIABLES if variable.name.startswith("MOJOCCL_") and variable.used}
    assert set(table) == ours
    for name, (kind, default, accepts) in table.items():
        variable = env.BY_NAME[name]
        if kind == "integer":
            assert (default, accepts) == (variable.default, variable.allowed()), name
        elif kind == "choice":
            assert default == variable.default and accepts == f"one of {variable.allowed()}", name
        else:
            assert kind == "text" and variable.int_range is None, name
            # A list-valued one names its own default; elsewhere the reader decides, as env.py describes.
            assert default in ("", variable.default), name
    # Every read goes through the table.
    for path in ROOT.glob("cpp/ccl/**/*.cc"):
        for name in re.findall(r'setting(?:Int|Choice|On|Text)\("([A-Z0-9_]+)"\)', path.read_text()):
            assert name in table, f"{path.name} reads {name}, which cpp/ccl/base/settings.cc lacks"
        assert "getenv(\"MOJOCCL_" not in path.read_text(), path.name


def test_a_bad_value_set_after_import_fails_every_rank_naming_it():
    # The group asks libmojoccl how long to wait for its first rank's id:
    # a value libmojoccl refuses is an error, not the default in silence.
    results = run_worker("init_only", 2, env={"SET_AFTER_IMPORT": "MOJOCCL_BOOTSTRAP_TIMEOUT_S=soon"},
                         check=False, timeout=60)
    for result in results:
        assert result.returncode != 0, result.stdout
        assert "MOJOCCL_BOOTSTRAP_TIMEOUT_S=soon is not valid: expected an integer" in result.stderr, result.stderr


def test_the_process_group_reads_its_environment_one_way():
    """The process group (and torchcomms' door, and the Python module) read
    a variable through backend/environment.h alone, and a MOJOCCL_* one not
    at all: they ask libmojoccl (mojocclSettingInt), whose table validates it."""
    for folder in ("backend", "torchcomms", "python"):
        for path in (ROOT / "cpp" / folder).glob("*"):
            text = path.read_text()
            if path.name != "environment.h":
                assert "getenv(" not in text, f"{path.name}: read it with environment() (backend/environment.h)"
            assert not re.search(r'environment\("MOJOCCL_', text), f"{path.name}: ask libmojoccl (settingInt)"


def test_docs_environment_table_is_generated_from_the_table():
    doc = (ROOT / "docs" / "environment.md").read_text()
    assert env.markdown_table() in doc, "regenerate it: torch-mojo env --markdown"


# ----------------------------------------------------------------- the CLI

def test_cli_info_and_cache_dir():
    out = python("from torch_mojo.cli import main; main(['info'])")
    assert re.search(r"cpu   libmojoccl\.so +/\S+/lib/libmojoccl\.so  \(installed with torch-mojo\)", out), out
    assert "(torch-mojo built with 2.13.0)" in out and "kernels: Mojo 1.2.0, CPU x86-64-v3" in out
    assert re.search(r"libfabric 1\.\d+: /\S+/libfabric\.so\.1", out), out
    # No Slingshot or InfiniBand here: `auto` takes tcp.
    assert "between nodes: tcp (auto, the default): offered" in out, out
    out = python("from torch_mojo.cli import main; main(['info'])", MOJOCCL_FABRIC_PROVIDER="cxi")
    assert "between nodes: cxi (MOJOCCL_FABRIC_PROVIDER): NOT offered here" in out, out
    out = python("from torch_mojo.cli import main; main(['info'])", MOJOCCL_FABRIC_PROVIDER="tcp")
    assert "between nodes: tcp (MOJOCCL_FABRIC_PROVIDER): offered" in out, out
    out = python("from torch_mojo.cli import main; main(['cache', 'dir'])",
                 TORCH_MOJO_BACKEND_CACHE_DIR="/shared/cache")
    assert out.strip() == "/shared/cache"


def info_json(**env_vars):
    import json

    return json.loads(python("from torch_mojo.cli import main; main(['info', '--json'])", **env_vars))


def test_cli_info_json_reports_libraries_and_the_environment():
    report = info_json(MOJOCCL_FABRIC_PROVIDR="cxi", MOJOCCL_ALGO="fast",
                       TORCH_MOJO_BACKEND_NCCL_LIB="/nowhere/libnccl.so.2")
    libraries = report["collective_libraries"]
    assert Path(libraries["cpu"]["path"]).name == "libmojoccl.so" and Path(libraries["cpu"]["path"]).exists()
    assert libraries["cuda"]["path"] is None
    assert libraries["cuda"]["source"] == "TORCH_MOJO_BACKEND_NCCL_LIB=/nowhere/libnccl.so.2: no such file"
    assert libraries["rocm"]["searched"][-3:] == ["$ROCM_PATH/lib", "/opt/rocm/lib", "the library path"]
    fabric = report["libfabric"]
    assert Path(fabric["path"]).exists() and "tcp" in fabric["providers"]  # Debian's libfabric
    assert report["kernels"]["mojo"] == "1.2.0" and set(report["kernels"]["gpu_kernel"]) == {"sm_90", "gfx942"}
    environment = report["environment"]
    assert "did you mean MOJOCCL_FABRIC_PROVIDER?" in environment["unknown"]["MOJOCCL_FABRIC_PROVIDR"]
    assert "expected one of auto, one_shot, two_shot" in environment["invalid"]["MOJOCCL_ALGO"]
    assert "MOJOCCL_BOOTSTRAP_TIMEOUT_S" in environment["at_default"]


def test_cli_info_follows_the_users_choices():
    fabric = info_json()["libfabric"]["path"]
    report = info_json(TORCH_MOJO_BACKEND_CCL="mojo", MOJOCCL_LIBFABRIC=fabric)
    assert report["accelerator_ccl"] == "mojo"
    assert report["collective_libraries"]["cuda"]["library"] == "libmojoccl.so"
    assert report["libfabric"]["source"] == "MOJOCCL_LIBFABRIC" and report["libfabric"]["path"] == fabric


# ------------------------------------------------------ use_local_rank_gpu

@pytest.fixture
def clean_env(monkeypatch):
    for name in ("LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    # As on a node whose vendor is known only from the launcher's variables.
    monkeypatch.setattr("torch_mojo.distributed._DEVICE_FILES", {"amd": [], "nvidia": []})
    return monkeypatch


def test_outside_torchrun_it_does_nothing(clean_env):
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert use_local_rank_gpu() is None
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


@pytest.mark.parametrize(
    "variable, listed, local_rank, expected",
    [
        ("CUDA_VISIBLE_DEVICES", "0,1,2,3", "2", "2"),
        ("CUDA_VISIBLE_DEVICES", "4,5,6,7", "1", "5"),
        ("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb", "1", "GPU-bbbb"),
        ("CUDA_VISIBLE_DEVICES", "3", "1", "3"),  # a list of one is left alone
        ("ROCR_VISIBLE_DEVICES", "0,1,2,3", "3", "3"),
    ],
)
def test_each_worker_keeps_its_own_entry(clean_env, variable, listed, local_rank, expected):
    import os

    clean_env.setenv(variable, listed)
    clean_env.setenv("LOCAL_RANK", local_rank)
    assert use_local_rank_gpu() == expected
    assert os.environ[variable] == expected


def test_too_many_workers_for_the_listed_gpus(clean_env):
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    clean_env.setenv("LOCAL_RANK", "3")
    with pytest.raises(RuntimeError, match=re.escape(
            "LOCAL_RANK=3 but CUDA_VISIBLE_DEVICES=0,1 lists only 2 devices")):
        use_local_rank_gpu()


def test_on_a_node_without_a_gpu_it_does_nothing(clean_env):
    clean_env.setenv("LOCAL_RANK", "1")
    assert use_local_rank_gpu() is None


def test_vendor_is_read_from_device_files_first(monkeypatch, tmp_path):
    from torch_mojo import distributed

    monkeypatch.setattr(distributed, "_DEVICE_FILES", {"amd": [str(tmp_path / "kfd")], "nvidia": [str(tmp_path)]})
    assert distributed.gpu_vendor() == "nvidia"
    (tmp_path / "kfd").touch()
    assert distributed.gpu_vendor() == "amd"
