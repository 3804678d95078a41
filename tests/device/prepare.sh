#!/usr/bin/env bash
# Run here, after `make build`: gathers into .device-carry/ (or the folder
# given) what tests/device/run.sh needs and a GPU machine may lack: the
# compiled Mojo kernels, CPU and GPU (Mojo and MAX may not be installed
# there), and libfabric's headers (only the headers are needed to build).
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=${1:-.device-carry}
rm -rf "$carry" && mkdir -p "$carry/include"
library_dir=$(.venv/bin/python -c "from torch_mojo._paths import library_dir; print(library_dir())")
cp "$library_dir/libtorch_mojo_kernels.so" "$carry/"
cp -r "$library_dir/gpu_kernels" "$carry/"
cp -r "$(dirname "$(find /usr/include -name fabric.h -path '*rdma*' | head -1)")" "$carry/include/rdma"
du -sh "$carry"
