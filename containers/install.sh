#!/bin/sh
# Installs torch-mojo from the source tree $1 into the image's Python
# ($PYTHON, default python3), against the image's own torch: the step a
# container recipe runs (%post), and the one its test runs in a venv.
# $2: the GPU architectures of the GPU kernel (gfx942, sm_90; ;-separated).
set -eu
SOURCE=$1
GPU_TARGETS=${2:-none}
PYTHON=${PYTHON:-python3}

# torch-mojo's C++ core is compiled against torch's C++ API: the image's
# torch must be the release pyproject.toml names.
"$PYTHON" - "$SOURCE/pyproject.toml" <<'CHECK'
import sys, tomllib
import torch
try:
    from packaging.requirements import Requirement
except ImportError:  # pip carries its own
    from pip._vendor.packaging.requirements import Requirement
wanted = next(Requirement(text) for text in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
              if text.startswith("torch"))
found = torch.__version__.split("+")[0]
if found not in wanted.specifier:
    sys.exit(f"this image has torch {torch.__version__}; torch-mojo needs {wanted}: build from an image "
             "with that torch (apptainer build --build-arg IMAGE=...)")
print(f"torch {torch.__version__} (the image's), as torch-mojo needs ({wanted})")
CHECK

# The build tools, at the versions pyproject.toml builds with (MAX's too
# where a GPU kernel is asked for): everything but torch.
REQUIREMENTS=$("$PYTHON" - "$SOURCE/pyproject.toml" "$SOURCE/requirements-dev.txt" "$GPU_TARGETS" <<'PINS'
import re, sys, tomllib
requires = tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]
pins = [text for text in requires if not text.startswith("torch")]
if sys.argv[3] != "none":
    pins += re.findall(r"^max-core==\S+", open(sys.argv[2]).read(), re.M)
print(" ".join(pins))
PINS
)
# shellcheck disable=SC2086  # one argument per requirement
"$PYTHON" -m pip install --no-cache-dir $REQUIREMENTS
"$PYTHON" -m pip install --no-cache-dir --no-build-isolation --no-deps "$SOURCE" \
  "--config-settings=cmake.define.TORCH_MOJO_GPU_TARGETS=$GPU_TARGETS"
"$PYTHON" -m torch_mojo.cli info
