#!/usr/bin/env bash
# torchcomms for a CPU build of torch: built once from its sources into
# torch-mojo's cache, then installed into the venv. Sites with torchcomms'
# own CUDA or ROCm wheel need none of this (docs/install.md).
#
#   scripts/build-torchcomms.sh [VENV]    default: .venv
#
# The sources are torchcomms 0.3.0's, as kept beside the project
# (../shared/vendor/torchcomms-*.tar.gz, or TORCHCOMMS_SOURCE_TARBALL).
# Prints, last, the unpacked source directory: torch-mojo's build reads
# torchcomms' headers from it (TORCH_MOJO_TORCHCOMMS_SOURCE).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${1:-.venv}
PYTHON=$(realpath -s "$VENV")/bin/python
TARBALL=${TORCHCOMMS_SOURCE_TARBALL:-$(ls ../shared/vendor/torchcomms-*.tar.gz 2>/dev/null | head -n1 || true)}
if [[ -z $TARBALL || ! -f $TARBALL ]]; then
  echo "build-torchcomms: no torchcomms source tarball (../shared/vendor/torchcomms-*.tar.gz);" \
       "set TORCHCOMMS_SOURCE_TARBALL to one" >&2
  exit 2
fi

# glog, gflags, fmt and nlohmann_json: found installed, never fetched.
scripts/apt-install.sh libgoogle-glog-dev libgflags-dev libfmt-dev nlohmann-json3-dev >&2

CACHE=$("$PYTHON" -c "from torch_mojo.env import cache_dir; print(cache_dir())")
TORCH_VERSION=$("$PYTHON" -c "import torch; print(torch.__version__)")
NAME=$(basename "$TARBALL" .tar.gz)
# One build per source and torch: the C++ ABI of a backend follows both.
HERE=$CACHE/torchcomms/$NAME-torch-$TORCH_VERSION
SRC=$HERE/src

if ! ls "$HERE"/wheel/torchcomms-*.whl >/dev/null 2>&1; then
  rm -rf "$HERE"
  mkdir -p "$SRC" "$HERE/deps/include" "$HERE/deps/lib"
  tar -xzf "$TARBALL" -C "$SRC" --strip-components=1
  # Debian 12 has nlohmann_json 3.11.2; torchcomms asks 3.11.3 and uses
  # nothing the two differ in.
  sed -i 's/nlohmann_json 3\.11\.3/nlohmann_json 3.11.2/' \
    "$SRC/comms/torchcomms/cmake/third_party/nlohmann_json.cmake"
  # Debian's gflags CMake config hands over the static, non-PIC library;
  # torchcomms' modules look in $CONDA_PREFIX first, so a prefix that holds
  # only the shared gflags and glog makes it link those.
  ln -s /usr/include/gflags /usr/include/glog "$HERE/deps/include/"
  for lib in libgflags.so libglog.so; do
    ln -s "$(ls /usr/lib/*-linux-gnu/$lib | head -n1)" "$HERE/deps/lib/$lib"
  done
  echo "build-torchcomms: building $NAME against torch $TORCH_VERSION (about 7 minutes on 2 cores)" >&2
  (cd "$SRC" && CONDA_PREFIX=$HERE/deps USE_NCCL=0 USE_NCCLX=0 USE_GLOO=0 USE_RCCL=0 \
     USE_TRANSPORT=0 USE_TRANSPORT_CCA_HOOK=0 \
     "$PYTHON" -m pip wheel . --no-build-isolation --no-deps -w "$HERE/wheel.partial") >&2
  mv "$HERE/wheel.partial" "$HERE/wheel"
fi

WHEEL=$(ls "$HERE"/wheel/torchcomms-*.whl | head -n1)
"$PYTHON" -m pip install --quiet --no-deps --force-reinstall "$WHEEL" >&2
echo "$SRC"
