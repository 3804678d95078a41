-- AMD MI300A nodes on HPE Slingshot 11. RCCL comes from the site's ROCm
-- module (which sets ROCM_PATH); between nodes libmojoccl uses libfabric's
-- cxi provider.
local site_title = "AMD MI300A with HPE Slingshot"
local site_help = [[
RCCL is taken from the ROCm this module depends on (ROCM_PATH); set
TORCH_MOJO_BACKEND_RCCL_LIB to use another librccl.so.1. Use the CPU build
of torch: a ROCm build of torch brings a second HIP runtime.

An MI300A's device memory is the node's RAM. This module sets
MODULAR_DEVICE_CONTEXT_MEMORY_MANAGER_VMM=1 so that each rank holds only
the memory it uses instead of about 90% of the node. With MAX 26.5 and
ROCm 6.4.3 a process then segfaults during interpreter exit, after the
script has finished: end scripts with os._exit(0) once
destroy_process_group() and checkpointing are done, or unset the variable
and warm the kernel cache with a single process before launching four
ranks per node.

Between nodes libmojoccl uses libfabric's cxi provider
(MOJOCCL_FABRIC_PROVIDER=cxi); MOJOCCL_FABRIC_DOMAIN picks the NIC when the
default (by GPU/NIC locality) does not suit.
]]
setenv("MOJOCCL_FABRIC_PROVIDER", "cxi")
setenv("MODULAR_DEVICE_CONTEXT_MEMORY_MANAGER_VMM", "1")
