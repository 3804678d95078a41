-- Within nodes: AMD GPUs, whose tensors go to RCCL.
local gpu_help = [[

RCCL is taken from the ROCm whose HIP runtime torch has loaded (a ROCm
build of torch), so that one HIP runtime serves both; set
TORCH_MOJO_BACKEND_RCCL_LIB to load another librccl.so.1. MIOpen keeps its
databases and kernels on node-local disk (/tmp/$USER-miopen).

An MI300A's device memory is the node's RAM. This module sets
MODULAR_DEVICE_CONTEXT_MEMORY_MANAGER_VMM=1 so that MAX's device (the
`mojo` device) holds only the memory it uses instead of about 90% of the
node. With MAX 26.5 and ROCm 6.4.3 a process then segfaults during
interpreter exit, after the script has finished: end scripts with
os._exit(0) once destroy_process_group() and checkpointing are done, or
unset the variable.
]]
