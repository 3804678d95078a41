-- Within nodes: NVIDIA GPUs, whose tensors go to NCCL.
local gpu_help = [[

NCCL is loaded from TORCH_MOJO_BACKEND_NCCL_LIB if set, else the site's
NCCL (a Spack build records it), else the nvidia-nccl-cu12/cu13 wheel,
else libnccl.so.2 on the library path (the site's NCCL module). NCCL needs
a driver recent enough for its CUDA: the cu13 wheel needs driver 580 or
newer.
]]
