#!/usr/bin/env bash
# rattler-build runs this in the source tree, with the host environment of
# recipe.yaml in $PREFIX: build against its torch, pybind11 and Mojo (no
# isolated build), and record its libfabric as the one to load first.
set -euxo pipefail
"$PYTHON" -m pip install . --no-deps --no-build-isolation -vv \
  "--config-settings=cmake.define.TORCH_MOJO_LIBFABRIC_LIBRARY=$PREFIX/lib/libfabric.so.1"
