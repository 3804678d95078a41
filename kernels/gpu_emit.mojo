# Compiles the GPU kernel (gpu_reduce.mojo) ahead of time for one
# architecture and writes the image and its entry point's name:
#
#   mojo run -D TORCH_MOJO_GPU_TARGET=sm_90 gpu_emit.mojo IMAGE ENTRY
#
# sm_* targets give PTX (the CUDA driver loads it, compiling it for the
# GPU once); gfx* targets give an AMD code object (an ELF the HIP runtime
# loads as it is). Compiling needs MAX (pip install max-core), not a GPU.

from std.sys import argv, get_defined_string
from max.gpu.host.compile import _compile_code, get_gpu_target

from gpu_reduce import tm_gpu_reduce

comptime TARGET = get_defined_string["TORCH_MOJO_GPU_TARGET", "sm_90"]()
comptime EMISSION = "object" if TARGET.startswith("gfx") else "asm"


def main() raises:
    var args = argv()
    if len(args) != 3:
        raise Error("usage: gpu_emit.mojo IMAGE ENTRY")
    var compiled = _compile_code[
        tm_gpu_reduce, target=get_gpu_target[TARGET](), emission_kind=EMISSION
    ]()
    with open(args[1], "w") as image:
        image.write(compiled.asm)
    with open(args[2], "w") as entry:
        entry.write(compiled.function_name, "\n")
