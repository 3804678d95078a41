#!/usr/bin/env bash
# Everything `make` needs on a fresh Debian machine: system packages (when
# run as root), then a virtual environment with the pinned Python tools.
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
# Compilers, CMake and the JSON header of torch's flight recorder for the C++
# core; Open MPI for the benchmark's MPI baseline (mpi4py builds against it);
# Lmod for the modulefile tests; libfabric for the node-to-node transport.
APT_PACKAGES=(g++ make cmake nlohmann-json3-dev openmpi-bin libopenmpi-dev lmod libfabric-dev libfabric-bin)

scripts/apt-install.sh "${APT_PACKAGES[@]}"

if [[ ! -x $VENV/bin/python ]]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r requirements-dev.txt
