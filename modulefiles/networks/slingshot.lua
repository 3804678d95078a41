-- Between nodes: HPE Slingshot 11, through libfabric's cxi provider.
local network_help = [[
On Slingshot, RCCL and NCCL reach the NICs only through libfabric's net
plugin (aws-ofi-nccl, built for ROCm or for CUDA).
Without it they fall back to sockets between nodes: the job runs, many
times slower. This module sets NCCL_NET="AWS Libfabric" only where it was
written with the plugin (`torch-mojo modulefile --net-plugin DIR`):
forcing NCCL_NET without one fails RCCL's init. Check a job with
`torch-mojo doctor`, and its NCCL_DEBUG=INFO logs with
`torch-mojo doctor --nccl-log FILE...`.

The settings below are HPE's for RCCL/NCCL on Slingshot. FI_CXI_RDZV_PROTO
=alt_read needs the job launched with rendezvous gets off (with them on,
libfabric keeps its default protocol, without a word):

    @LAUNCH_LINE@

libmojoccl uses the cxi provider between nodes (MOJOCCL_FABRIC_PROVIDER=cxi);
MOJOCCL_FABRIC_DOMAIN picks the NIC when the default (by GPU/NIC locality)
does not suit.
]]
