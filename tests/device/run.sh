#!/usr/bin/env bash
# The device checks: on a machine with an NVIDIA GPU and a CUDA build of
# torch, builds torch-mojo against that torch and runs tests/test_device.py
# (NCCL collectives with one rank, libmojoccl collectives with two ranks on
# the one GPU, DDP on the GPU, a busbw table, the Mojo GPU kernel against
# the CPU kernel). Results go to $OUT (default results/device/):
# machine.txt, build.log, pytest.log, busbw.txt, gpu_kernel.txt, info.txt.
#
# Prepare here with tests/device/prepare.sh, then on the GPU machine, from
# the repository root:  bash tests/device/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${OUT:-$root/results/device}
python=${PYTHON:-python3}
carry=$root/.device-carry
mkdir -p "$out"

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  "$python" -m pip list 2>/dev/null | grep -i -E "^(nvidia-nccl|pybind11|scikit-build-core|cmake|ninja) "
} 2>&1 | tee "$out/machine.txt"

build_options=()
[ -f "$carry/libtorch_mojo_kernels.so" ] && ! command -v mojo >/dev/null &&
  build_options+=(-C "cmake.define.TORCH_MOJO_KERNELS_LIBRARY=$carry/libtorch_mojo_kernels.so")
[ -d "$carry/gpu_kernels" ] && ! "$python" -c "import importlib.metadata as m; m.version('max-core')" 2>/dev/null &&
  build_options+=(-C "cmake.define.TORCH_MOJO_GPU_KERNELS_DIR=$carry/gpu_kernels")
[ -d "$carry/include/rdma" ] && build_options+=(-C "cmake.define.LIBFABRIC_INCLUDE_DIR=$carry/include")
# Into the machine's own environment (it is handed back afterwards), so that
# every process the tests start finds it.
echo "building torch-mojo against this machine's torch ..."
if ! CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$python" -m pip install --no-build-isolation --no-deps \
    --no-cache-dir "${build_options[@]}" . >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  exit 1
fi

export TORCH_MOJO_DEVICE_RESULTS=$out/busbw.txt
"$python" -m pytest -v -p no:cacheprovider -s tests/test_device.py 2>&1 | tee "$out/pytest.log"
status=${PIPESTATUS[0]}
"$python" -c "from torch_mojo.cli import main; main(['info'])" >"$out/info.txt" 2>&1 || true
exit "$status"
