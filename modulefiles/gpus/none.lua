-- Within nodes: CPU tensors over shared memory.
local gpu_help = ""
