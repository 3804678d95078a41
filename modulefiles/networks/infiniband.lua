-- Between nodes: InfiniBand. NCCL and RCCL use their own verbs transport.
local network_help = [[
NCCL and RCCL use their own InfiniBand transport: no plugin is needed.
The adapters they use (NCCL_IB_HCA) and the bootstrap interface
(NCCL_SOCKET_IFNAME, MOJOCCL_SOCKET_IFNAME) are the site's to set, in this
module (`torch-mojo modulefile --setenv NAME=VALUE`) or in job scripts.
libmojoccl uses libfabric's verbs provider between nodes
(MOJOCCL_FABRIC_PROVIDER=verbs).
]]
