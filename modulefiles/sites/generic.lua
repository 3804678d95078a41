-- Any Linux cluster: CPU tensors over shared memory within a node.
local site_title = "any Linux cluster"
local site_help = [[
Set TORCH_MOJO_BACKEND_CACHE_DIR to a directory every node sees if the site
has not (`torch-mojo cache dir` prints the one in effect).
]]
