"""The Lmod modulefiles of `torch-mojo modulefile`, loaded by the real Lmod
(Debian's `lmod` package) in clean shells."""

import os
import subprocess
import sys

import pytest

from tests.harness import ROOT
from torch_mojo import __version__, modulefile, site_settings

LMOD = "/usr/share/lmod/lmod"
CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"


def lmod_shell(script: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Runs `script` in bash with Lmod set up and nothing of this test's
    environment: no virtual environment on PATH, no PYTHONPATH."""
    environment = {"HOME": os.environ.get("HOME", "/root"), "USER": "tester", "PATH": CLEAN_PATH}
    return subprocess.run(["bash", "-c", f"source {LMOD}/init/bash\nset -e\n{script}"], env=environment,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def values(stdout: str) -> dict[str, str]:
    """NAME=VALUE lines of a script's output."""
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line and line[0].isupper())


def write_site_module(root, name, text):
    """A module of the site's own (the test's stand-in for a site's tree)."""
    path = root / f"{name}.lua"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def net_plugin_dir(root, name="librccl-net.so"):
    """A stand-in for a plugin's lib directory: the module checks the file
    is there by its name, as RCCL and NCCL look it up."""
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(b"")
    return root


MACHINES = [(network, gpu) for network in site_settings.NETWORKS for gpu in site_settings.GPUS]


def test_every_network_and_gpu_passes_lmods_syntax_checks(tmp_path):
    """One module tree per machine kind (9), each checked by Lmod."""
    plugin = net_plugin_dir(tmp_path / "plugin", "libnccl-net.so")
    (plugin / "librccl-net.so").write_bytes(b"")
    for network, gpu in MACHINES:
        tree = tmp_path / f"{network}-{gpu}"
        path = modulefile.write(str(tree), network=network, gpu=gpu, requires=["libfabric/1.22.0"],
                                net_plugin=str(plugin) if gpu != "none" else None,
                                cache_dir="/scratch/$USER/tm", settings=[("NCCL_DEBUG", "WARN")])
        assert path == str(tree / "torch-mojo" / f"{__version__}.lua")
        write_site_module(tree, "libfabric/1.22.0", 'whatis("libfabric")\n')
        checked = subprocess.run([f"{LMOD}/libexec/check_module_tree_syntax", str(tree)],
                                 capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0 and "No errors found" in checked.stdout, checked.stdout + checked.stderr
    result = lmod_shell("\n".join(f"module use {tmp_path}/{network}-{gpu}\nmodule --checkSyntax load torch-mojo\n"
                                  f"module unuse {tmp_path}/{network}-{gpu}" for network, gpu in MACHINES))
    assert result.returncode == 0, result.stderr


def test_the_slingshot_module_sets_what_sites_publish_and_unload_gives_back_the_users(tmp_path):
    """AMD GPUs on Slingshot with the plugin, under the real Lmod: every
    published setting with its value, the plugin on LD_LIBRARY_PATH with
    NCCL_NET naming it; values the user had before come back at unload."""
    plugin = net_plugin_dir(tmp_path / "aws-ofi-rccl" / "lib")
    modulefile.write(str(tmp_path / "modules"), network="slingshot", gpu="amd", net_plugin=str(plugin),
                     settings=[("NCCL_NET_GDR_LEVEL", "3")])
    expected = {setting.name: setting.value.replace("$USER", "tester")
                for setting in site_settings.for_machine("slingshot", "amd")}
    expected.update(NCCL_NET_GDR_LEVEL="3", NCCL_NET=site_settings.PLUGIN_NETWORK)
    assert {"NCCL_SOCKET_IFNAME", "FI_CXI_RDZV_PROTO", "HSA_FORCE_FINE_GRAIN_PCIE", "MIOPEN_USER_DB_PATH",
            "MOJOCCL_FABRIC_PROVIDER"} <= set(expected)
    show = "\n".join(f'echo "{name}=${{{name}:-unset}}"' for name in sorted(expected))
    result = lmod_shell(f"""
export NCCL_SOCKET_IFNAME=ib0 FI_CXI_RX_MATCH_MODE=software LD_LIBRARY_PATH=/site/lib
module use {tmp_path / "modules"}
module load torch-mojo
{show}
echo "LIBRARY_PATH_LOADED=$LD_LIBRARY_PATH"
module unload torch-mojo
echo "AFTER_SOCKET=$NCCL_SOCKET_IFNAME"; echo "AFTER_MATCH=$FI_CXI_RX_MATCH_MODE"
echo "AFTER_NET=${{NCCL_NET:-unset}}"; echo "AFTER_CXI=${{FI_CXI_RDZV_PROTO:-unset}}"
echo "LIBRARY_PATH_AFTER=$LD_LIBRARY_PATH"
""")
    assert result.returncode == 0, result.stdout + result.stderr
    seen = values(result.stdout)
    assert {name: seen[name] for name in expected} == expected
    assert {str(plugin), "/site/lib"} <= set(seen["LIBRARY_PATH_LOADED"].split(":"))
    assert (seen["AFTER_SOCKET"], seen["AFTER_MATCH"]) == ("ib0", "software")
    assert (seen["AFTER_NET"], seen["AFTER_CXI"]) == ("unset", "unset")
    assert seen["LIBRARY_PATH_AFTER"] == "/site/lib"


def test_nccl_net_is_set_only_with_the_plugin(tmp_path):
    """Forcing NCCL_NET without the plugin fails RCCL's init: a module
    written without --net-plugin leaves it unset (and the command warns);
    a plugin with only a suffixed name gets NCCL_NET_PLUGIN too."""
    def render(**options):
        return modulefile.render(network="slingshot", **options)

    without = render(gpu="amd")
    assert "NCCL_NET\"" not in without and 'pushenv("FI_CXI_RDZV_PROTO", "alt_read")' in without
    assert "RCCL will use sockets" in modulefile.missing_plugin_warning("slingshot", "amd", None)
    assert modulefile.missing_plugin_warning("infiniband", "nvidia", None) is None
    suffixed = net_plugin_dir(tmp_path / "ofi", "libnccl-net-ofi.so")
    text = render(gpu="nvidia", net_plugin=str(suffixed))
    assert 'pushenv("NCCL_NET", "AWS Libfabric")' in text and 'pushenv("NCCL_NET_PLUGIN", "ofi")' in text
    assert 'pushenv("NCCL_PROTO", "^LL128")' in text and "HSA_FORCE" not in text
    with pytest.raises(ValueError, match="no librccl-net.so .* there; give the plugin's lib directory"):
        render(gpu="amd", net_plugin=str(suffixed))
    with pytest.raises(ValueError, match="name the GPUs too"):
        render(gpu="none", net_plugin=str(suffixed))
    infiniband = modulefile.render(network="infiniband", gpu="nvidia")
    assert 'pushenv("MOJOCCL_FABRIC_PROVIDER", "verbs")' in infiniband and "FI_CXI" not in infiniband


@pytest.mark.parametrize("gpu, plugin", [("amd", "librccl-net.so"), ("nvidia", "libnccl-net-ofi.so")])
def test_our_modules_pass_our_doctor(tmp_path, gpu, plugin):
    """A Slingshot module that `torch-mojo modulefile` wrote (the suffixed
    plugin sets NCCL_NET_PLUGIN beside NCCL_NET), loaded by Lmod: the
    doctor's checks of the environment find nothing in it."""
    from torch_mojo.doctor.variables import review_net_plugin, review_rendezvous_gets, review_site_settings

    directory = net_plugin_dir(tmp_path / "aws-ofi-nccl" / "lib", plugin)
    modulefile.write(str(tmp_path / "modules"), network="slingshot", gpu=gpu, net_plugin=str(directory))
    result = lmod_shell(f"module use {tmp_path / 'modules'}\nmodule load torch-mojo\nenv")
    assert result.returncode == 0, result.stderr
    loaded = values(result.stdout)
    assert loaded["NCCL_NET"] == site_settings.PLUGIN_NETWORK
    assert ("NCCL_NET_PLUGIN" in loaded) == (plugin == "libnccl-net-ofi.so")
    kind = "rccl" if gpu == "amd" else "nccl"
    assert review_site_settings(loaded, "slingshot", gpu) == []
    assert review_net_plugin(loaded, kind) == []
    # No Slingshot NIC here: nothing says rendezvous gets are on.
    assert review_rendezvous_gets(loaded, str(tmp_path / "no-cxi")) == []


@pytest.mark.parametrize("launcher", list(site_settings.LAUNCHERS))
def test_the_help_gives_the_sites_launch_line(launcher):
    text = modulefile.render(network="slingshot", gpu="amd", launcher=launcher)
    assert site_settings.LAUNCHERS[launcher].example in text and "@LAUNCH_LINE@" not in text
    others = [each.example for name, each in site_settings.LAUNCHERS.items() if name != launcher]
    assert not any(other in text for other in others)
    with pytest.raises(ValueError, match="unknown launcher 'lsf': expected one of slurm, flux, pbs"):
        modulefile.render(network="slingshot", gpu="amd", launcher="lsf")


def test_the_syntax_checks_catch_a_broken_modulefile(tmp_path):
    write_site_module(tmp_path, "torch-mojo/9.9", 'setenv("A" "b")\n')
    checked = subprocess.run([f"{LMOD}/libexec/check_module_tree_syntax", str(tmp_path)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode != 0 and "possible errors" in checked.stdout


PRINT_PATHS = """paths() {
  echo "PATH_$1=$PATH"; echo "PYTHONPATH_$1=${PYTHONPATH:-}"; echo "LD_LIBRARY_PATH_$1=${LD_LIBRARY_PATH:-}"
}"""


def test_module_load_is_all_a_job_needs_and_unload_restores_the_environment(tmp_path):
    modulefile.write(str(tmp_path / "modules"), cache_dir="/scratch/$USER/torch-mojo")
    result = lmod_shell(f"""{PRINT_PATHS}
module use {tmp_path / "modules"}
paths BEFORE
module load torch-mojo
echo "CACHE=$TORCH_MOJO_BACKEND_CACHE_DIR"
echo "PYTHON=$(command -v python)"
python -c "import torch_mojo; print('IMPORTED=' + torch_mojo.__version__)"
cd {tmp_path}
torchrun --standalone --nproc-per-node=2 {ROOT}/examples/train_ddp.py --steps 20 --save {tmp_path}/model.pt
module unload torch-mojo
paths AFTER
""")
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    seen = values(result.stdout)
    assert seen["IMPORTED"] == __version__
    assert seen["CACHE"] == "/scratch/tester/torch-mojo"  # $USER, at load time
    assert seen["PYTHON"] == os.path.join(os.path.dirname(sys.executable), "python")
    assert "backend mojo, world size 2" in result.stdout and "step  20  loss" in result.stdout
    assert (tmp_path / "model.pt").exists()
    for name in ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH"):
        # As sets: Lmod drops duplicate entries.
        before = set(filter(None, seen[f"{name}_BEFORE"].split(":")))
        after = set(filter(None, seen[f"{name}_AFTER"].split(":")))
        assert after == before, name


def test_a_site_variant_loads_the_sites_modules_first(tmp_path):
    """A module for AMD GPUs on Slingshot with depends_on the site's
    libfabric module (here one for Debian's libfabric): loading torch-mojo
    loads it, unloading torch-mojo unloads it, and a missing one stops the
    load with Lmod's message naming it."""
    write_site_module(tmp_path, "libfabric/1.22.0",
                      'whatis("libfabric")\nsetenv("SITE_LIBFABRIC", "/usr/lib/x86_64-linux-gnu")\n')
    modulefile.write(str(tmp_path), network="slingshot", gpu="amd", requires=["libfabric/1.22.0"])
    result = lmod_shell(f"""
module use {tmp_path}
module load torch-mojo
echo "LOADED=$(module -t list 2>&1 | sort | tr '\\n' ' ')"
echo "PROVIDER=$MOJOCCL_FABRIC_PROVIDER"
echo "VMM=$MODULAR_DEVICE_CONTEXT_MEMORY_MANAGER_VMM"
echo "SITE_LIBFABRIC=$SITE_LIBFABRIC"
module unload torch-mojo
echo "LEFT=$(module -t list 2>&1 | tr '\\n' ' ')"
""")
    assert result.returncode == 0, result.stdout + result.stderr
    seen = values(result.stdout)
    assert seen["LOADED"].split() == ["libfabric/1.22.0", f"torch-mojo/{__version__}"]
    assert seen["PROVIDER"] == "cxi" and seen["VMM"] == "1" and seen["SITE_LIBFABRIC"]
    assert "libfabric" not in seen["LEFT"] and "torch-mojo" not in seen["LEFT"]

    modulefile.write(str(tmp_path), network="slingshot", gpu="amd", requires=["rocm/6.4.3"])
    missing = lmod_shell(f"module use {tmp_path}\nmodule load torch-mojo")
    assert missing.returncode != 0 and "rocm/6.4.3" in missing.stderr


def test_modulefile_command_checks_what_the_site_asks_for(tmp_path):
    def command(*args):
        return subprocess.run([sys.executable, "-m", "torch_mojo.cli", "modulefile", *args],
                              capture_output=True, text=True, timeout=60)

    typo = command("--setenv", "MOJOCCL_FABRIC_PROVIDR=cxi")
    assert typo.returncode != 0 and "MOJOCCL_FABRIC_PROVIDR: not a torch-mojo variable" in typo.stderr
    bad = command("--setenv", "MOJOCCL_ALGO=fastest")
    assert bad.returncode != 0 and "expected one of auto, one_shot, two_shot" in bad.stderr
    network = command("--network", "moon")
    assert network.returncode != 0 and "choose from 'ethernet', 'slingshot', 'infiniband'" in network.stderr
    plugin = command("--network", "slingshot", "--gpu", "amd", "--net-plugin", str(tmp_path))
    assert plugin.returncode != 0 and f"--net-plugin {tmp_path}: no librccl-net.so" in plugin.stderr
    warned = command("--network", "slingshot", "--gpu", "amd")
    assert warned.returncode == 0 and "warning: no --net-plugin" in warned.stderr
    bad_path = command("--prepend-path", "PYTHONPATH")
    assert bad_path.returncode != 0 and "NAME=DIR" in bad_path.stderr
    written = command("--network", "infiniband", "--gpu", "nvidia", "--setenv", "NCCL_IB_HCA=mlx5_0",
                      "--prepend-path", "PYTHONPATH=/sw/torch/site-packages", "--output", str(tmp_path))
    assert written.returncode == 0 and f"module use {tmp_path}" in written.stdout
    text = (tmp_path / "torch-mojo" / f"{__version__}.lua").read_text()
    assert 'setenv("NCCL_IB_HCA", "mlx5_0")' in text and 'family("pytorch")' in text
    assert 'prepend_path("PYTHONPATH", "/sw/torch/site-packages")' in text


def test_variables_in_paths_are_read_at_load_time():
    assert modulefile.lua_string("/scratch/$USER/cache") == '"/scratch/" .. (os.getenv("USER") or "") .. "/cache"'
    assert modulefile.lua_string("${HOME}") == '(os.getenv("HOME") or "")'
    assert modulefile.lua_string('plain "quoted"') == '"plain \\"quoted\\""'


def test_the_install_guide_lists_the_published_settings():
    page = (ROOT / "docs" / "install.md").read_text()
    assert site_settings.markdown_table() in page
