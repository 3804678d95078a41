-- NVIDIA H100 nodes on InfiniBand. NCCL comes from the site's CUDA/NCCL
-- modules or the NCCL wheel; NCCL reads its own NCCL_* variables.
local site_title = "NVIDIA H100 with InfiniBand"
local site_help = [[
NCCL is loaded from TORCH_MOJO_BACKEND_NCCL_LIB if set, else from the
nvidia-nccl-cu12/cu13 wheel, else libnccl.so.2 on the library path (the
site's NCCL module). NCCL needs a driver recent enough for its CUDA: the
cu13 wheel needs driver 580 or newer.

The adapters NCCL uses (NCCL_IB_HCA) and the bootstrap interface
(NCCL_SOCKET_IFNAME, MOJOCCL_SOCKET_IFNAME) are the site's to set, in this
module (`torch-mojo modulefile --setenv NAME=VALUE`) or in job scripts.
]]
