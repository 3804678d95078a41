/* A stand-in for aws-ofi-nccl, which cannot be built here (its sources are
 * out of reach): a net plugin that NCCL's plugin search, and the emulated
 * NCCL's, find by its file name (libnccl-net.so) and its ncclNetPlugin_v8
 * symbol, whose first member names its network as aws-ofi-nccl names it.
 * It carries nothing: the emulated NCCL's bytes go through libmojoccl. */
__attribute__((visibility("default"))) const struct {
  const char* name;
} ncclNetPlugin_v8 = {"AWS Libfabric"};
