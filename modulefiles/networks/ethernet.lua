-- Between nodes: Ethernet, or a network this module does not know.
local network_help = [[
Between nodes libmojoccl uses the libfabric provider MOJOCCL_FABRIC_PROVIDER
names (tcp on Ethernet). Set TORCH_MOJO_BACKEND_CACHE_DIR to a directory
every node sees if the site has not (`torch-mojo cache dir` prints the one
in effect).
]]
