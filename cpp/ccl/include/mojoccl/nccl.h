/*
 * libmojoccl's public interface: the C API of NCCL, for host memory.
 *
 * The names, signatures and enum values are NCCL's, so that a program (our
 * process group among them) can load libmojoccl, NCCL or RCCL through the
 * same function table and switch library by switching one file. This header
 * declares only what libmojoccl implements.
 */
#ifndef MOJOCCL_NCCL_H_
#define MOJOCCL_NCCL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOJOCCL_MAJOR 0
#define MOJOCCL_MINOR 1
#define MOJOCCL_PATCH 0
/* Encoded as NCCL encodes versions since 2.9: major*10000 + minor*100 + patch. */
#define MOJOCCL_VERSION_CODE (MOJOCCL_MAJOR * 10000 + MOJOCCL_MINOR * 100 + MOJOCCL_PATCH)

/* libmojoccl's own: how long, unless MOJOCCL_BOOTSTRAP_TIMEOUT_S says, a
 * rank waits for its communicator's other ranks at set-up (seconds); a
 * process group waiting for its communicator's id waits as long. */
#define MOJOCCL_BOOTSTRAP_TIMEOUT_S_DEFAULT 120

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef struct ncclComm* ncclComm_t;

/* NCCL's calls take a cudaStream_t; host collectives take NULL. */
typedef void* ncclStream_t;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclNumTypes = 10
} ncclDataType_t;

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5
} ncclRedOp_t;

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);

/* Memory the other ranks of a node can map. Collectives on buffers in it
 * read and write peers' buffers in place, with no staging copy. */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t ncclMemFree(void* ptr);
/* Registration is implied for ncclMemAlloc memory; these check and accept it. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           ncclStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           ncclStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, ncclStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        ncclStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               ncclStream_t stream);

/* Point-to-point. Sends are buffered: a send completes once its data is in
 * shared memory, so sends and receives between two ranks in both directions
 * cannot deadlock, inside a group or not. */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, ncclStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, ncclStream_t stream);

/* An all-to-all (RCCL's call; NCCL has none): every rank sends
 * sendcounts[p] elements from sendbuff + sdispls[p] to rank p and receives
 * recvcounts[p] elements from it into recvbuff + rdispls[p] (counts and
 * displacements in elements; the part to itself is copied). A collective:
 * every rank of `comm` calls it. A part whose size differs from what its
 * receiver expects is consumed and reported, naming both sides. Between
 * nodes each part goes from sendbuff as it is, not copied first as a
 * send's is, since every rank's receives are posted in the same call. */
ncclResult_t ncclAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                           void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                           ncclDataType_t datatype, ncclComm_t comm, ncclStream_t stream);

ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

/* libmojoccl's own (not NCCL's): every MOJOCCL_* variable it reads, one
 * line each: "name<TAB>integer|choice|text<TAB>default<TAB>what it accepts"
 * (a text's default is empty where libmojoccl decides it). */
const char* mojocclSettings(void);

/* libmojoccl's own: the integer setting `name` as libmojoccl reads it (its
 * default where unset); a value it does not accept is ncclInvalidArgument,
 * with the variable and what it accepts in ncclGetLastError(). What the
 * process group asks rather than read the variable itself. */
ncclResult_t mojocclSettingInt(const char* name, int64_t* value);

/* libmojoccl's own: the libfabric provider and domain a communicator
 * spanning nodes would open on this rank, the localRank-th of its node (MOJOCCL_FABRIC_DOMAIN may list a domain per local rank), as
 * text; on failure ncclInvalidUsage, with the reason in ncclGetLastError(). */
ncclResult_t mojocclDescribeFabric(int localRank, char* text, size_t size);

/* libmojoccl's own: the providers MOJOCCL_FABRIC_PROVIDER=auto tries, in
 * order, comma-separated ("cxi,verbs,efa,tcp"). */
const char* mojocclFabricAutoProviders(void);

/* libmojoccl's own: MPI_ANY_SOURCE. Receives the first message that any
 * other rank sends to this one and stores its sender in *peer. Host memory
 * only (stream NULL), outside a group, and within one node: otherwise
 * ncclInvalidUsage. */
ncclResult_t mojocclRecvAny(void* recvbuff, size_t count, ncclDataType_t datatype, int* peer,
                            ncclComm_t comm, ncclStream_t stream);

/* libmojoccl's own, for benchmarks: the provider's own point-to-point.
 * Sends `bytes` from sendbuff to rank `to` and receives as many from rank
 * `from` into recvbuff (both on other nodes), posted directly on the fabric
 * endpoint: one message each way (pieces of 16 MiB past that), no header,
 * no copy, no agreement on the call, so every pair of ranks must pass the
 * same size. Host memory, outside a group; a rank on this node, or a
 * communicator within one node: ncclInvalidUsage. What `torch-mojo bench`
 * reports as its `wire` column. */
ncclResult_t mojocclWireSendRecv(const void* sendbuff, int to, void* recvbuff, int from, size_t bytes,
                                 ncclComm_t comm);

/* libmojoccl's own: the ranks of `comm` known to have ended without leaving
 * it (killed, crashed, their node lost), ascending, in ranks[0..*count); a
 * rank that destroyed or aborted its communicator is not among them.
 * `ranks` holds room for the communicator's size. After ncclCommAbort, the
 * ranks known when the abort took effect. What a program passes to
 * torch.distributed.shrink_group. */
ncclResult_t mojocclCommFailedRanks(ncclComm_t comm, int* ranks, int* count);

/* libmojoccl's own: the shape of `comm`: how many nodes its ranks are on,
 * how many of them share this rank's node, and this rank's place among
 * those (0 for the node's leader). What NCCL logs at init as nNodes,
 * localRanks and localRank. */
ncclResult_t mojocclCommNodes(ncclComm_t comm, int* nodes, int* localRanks, int* localRank);

/* libmojoccl's own: the cost model of the all-reduce between nodes (one
 * leader each) for `bytes` past the size that travels in one message:
 * the algorithm named by `algorithm` ("ring", "recursive_doubling", "rabenseifner", "tree"), or,
 * where it is NULL, the one this process's MOJOCCL_NET_ALGO lets the model
 * choose; its name goes to `chosen` (`size` bytes) and its predicted time
 * to *seconds. What `torch-mojo bench --model` prints. */
/* libmojoccl's own: how many of `comm`'s ranks run on this machine on CPUs
 * that overlap this rank's affinity mask (itself included), and how many
 * CPUs their masks cover together. Ranks bound to cores of their own count
 * 1. The process group judges from it whether torch's threads outnumber
 * the cores. */
ncclResult_t mojocclCommCoreSharing(ncclComm_t comm, int* ranks, int* cpus);

/* libmojoccl's own: how long this rank's ncclCommInitRank took, phase by
 * phase, in seconds: [0] the bootstrap (meeting the root, the table of
 * ranks), [1] the node's shared memory, [2] the settings every rank must
 * share, [3] the fabric endpoint and every rank's address, [4] the peer
 * watch and the leaders' connections ([3] and [4] 0 on one node). At most
 * *count phases are written; *count becomes the number written. */
ncclResult_t mojocclCommSetupSeconds(ncclComm_t comm, double* seconds, int* count);

/* libmojoccl's own: how many exchanges over the bootstrap's tree this
 * rank's set-up took after the table of ranks, and the bytes this rank put
 * into those that are all-gathers (every rank receives every rank's part;
 * the others end in a verdict of a few hundred bytes): what the model of
 * set-up time (benchmarks/setup_time.py) is built from. */
ncclResult_t mojocclCommSetupTraffic(ncclComm_t comm, int* rounds, uint64_t* bytes);

/* libmojoccl's own: starts loading libfabric (not yet its providers) in a
 * thread of its own and returns at once, so that a job's first
 * communicator across nodes does not wait for the load. Called early by
 * a job that spans nodes (torch_mojo.register_mojo_devices does); a
 * failure to load is reported by that communicator. */
ncclResult_t mojocclPreloadFabric(void);

/* libmojoccl's own: the bootstrap rehearsed at a scale no machine's
 * processes reach. Ranks [first, first + count) of an nranks communicator,
 * each a thread of the calling process, join the root named by `id` (made
 * by ncclGetUniqueId in any process) and make `rounds` exchanges over the
 * tree as a set-up makes them: `gathers` all-gathers sharing `gatherBytes`
 * a rank, the rest comparisons of 512 bytes. Rank `leaver` (-1: none)
 * leaves after the table, as a process that dies in set-up does. */
typedef struct {
  int nranks;
  int first;
  int count;
  int rounds;
  int gathers;
  uint64_t gatherBytes;
  int leaver;
} mojocclRehearsal;
/* For each of its ranks i: seconds[i] from the common start (every thread
 * made) to the end of its last exchange, results[i] its ncclResult_t and, where that is not ncclSuccess,
 * its message at messages + i * messageBytes (cut to fit). */
ncclResult_t mojocclRehearseBootstrap(const ncclUniqueId* id, const mojocclRehearsal* plan, double* seconds,
                                      int* results, char* messages, size_t messageBytes);

/* libmojoccl's own: how many connections and messages from outside `comm`
 * this rank has turned away (docs/security.md): connections to its node
 * leader's peer watch without the communicator's proof, messages between
 * nodes without its key. Each first one, and each tenth power, is also
 * logged as a WARNING. */
ncclResult_t mojocclCommRejected(ncclComm_t comm, uint64_t* count);

ncclResult_t mojocclPredictAllReduce(int nodes, size_t bytes, const char* algorithm, char* chosen, size_t size,
                                     double* seconds);

/* libmojoccl's own: the same for a broadcast between nodes past the
 * frames: "ring" (along the leaders, a chain) or "tree" (a binomial tree),
 * the one this process's MOJOCCL_NET_ALGO lets the model choose. */
ncclResult_t mojocclPredictBroadcast(int nodes, size_t bytes, char* chosen, size_t size, double* seconds);

#ifdef __cplusplus
}
#endif

#endif /* MOJOCCL_NCCL_H_ */
