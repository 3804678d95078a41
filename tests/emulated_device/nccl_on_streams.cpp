// A vendor collective library for the emulated device, built the way NCCL
// behaves: each call is only enqueued on the stream it is given and runs
// later, in stream order, on that stream's thread; an error met there is
// reported by ncclCommGetAsyncError, not by the call. The collectives
// themselves are libmojoccl's (the device's memory is host memory), loaded
// from EMULATED_NCCL_BACKING.
//
// At ncclCommInitRank it also chooses its network between nodes as NCCL
// does (a net plugin found by NCCL_NET_PLUGIN's rules, else its sockets;
// NCCL_NET naming one that is not there fails the init) and, with
// NCCL_DEBUG=INFO, logs that choice in NCCL's own lines, to NCCL_DEBUG_FILE
// (%h: host, %p: pid) or stdout. Its bytes still go through libmojoccl:
// what it logs is the choice a real NCCL would make here, for the doctor's
// check of those lines.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "mojoccl/nccl.h"
#include "stream.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

void* backing() {
  static void* handle = [] {
    const char* path = std::getenv("EMULATED_NCCL_BACKING");
    void* loaded = path != nullptr ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (loaded == nullptr) {
      std::fprintf(stderr, "nccl_on_streams: set EMULATED_NCCL_BACKING to libmojoccl.so (%s)\n",
                   path != nullptr ? dlerror() : "unset");
      std::abort();
    }
    return loaded;
  }();
  return handle;
}

template <typename Function>
Function real(const char* name) {
  return reinterpret_cast<Function>(dlsym(backing(), name));
}

// Errors met on a stream, per communicator, until the owner asks.
std::mutex errorsMutex;
std::map<ncclComm_t, ncclResult_t> asyncErrors;

void noteError(ncclComm_t comm, ncclResult_t result) {
  if (result == ncclSuccess) return;
  std::lock_guard<std::mutex> lock(errorsMutex);
  asyncErrors.emplace(comm, result);
}

using Call = std::function<ncclResult_t()>;
struct Pending {
  ncclComm_t comm;
  Call call;
};
thread_local int groupDepth = 0;
thread_local std::vector<Pending> groupCalls;
thread_local EmulatedStream* groupStream = nullptr;

void runOnStream(EmulatedStream* stream, std::function<void()> work) {
  auto* boxed = new std::function<void()>(std::move(work));
  stream->enqueue(stream, [](void* argument) {
    auto* held = static_cast<std::function<void()>*>(argument);
    (*held)();
    delete held;
  }, boxed);
}

ncclResult_t enqueue(ncclComm_t comm, ncclStream_t stream, Call call) {
  if (stream == nullptr) return call();  // host memory: at once, as libmojoccl does
  auto* target = static_cast<EmulatedStream*>(stream);
  if (groupDepth > 0) {
    groupStream = target;
    groupCalls.push_back({comm, std::move(call)});
    return ncclSuccess;
  }
  runOnStream(target, [comm, call] { noteError(comm, call()); });
  return ncclSuccess;
}

// ---- the network between nodes, chosen and logged as NCCL does

struct Network {
  std::string name;        // "Socket", or the plugin's network
  std::string notFound;    // the plugin files looked for in vain
  int pluginVersion = 0;   // 0: no plugin
};

// A net plugin exports ncclNetPlugin_vN, a struct whose first member is
// the network's name.
Network chooseNetwork() {
  const char* named = std::getenv("NCCL_NET_PLUGIN");
  std::vector<std::string> files;
  if (named == nullptr || *named == '\0') {
    files = {"libnccl-net.so"};
  } else if (std::strcmp(named, "none") != 0) {
    files = {named};
    std::string name(named);
    bool fileName = name.rfind("lib", 0) == 0 && name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0;
    if (name.find('/') == std::string::npos && !fileName) files.push_back("libnccl-net-" + name + ".so");
  }
  Network chosen{"Socket", "", 0};
  for (const auto& file : files) {
    void* plugin = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    for (int version = 10; plugin != nullptr && version >= 5; --version) {
      auto* table = dlsym(plugin, ("ncclNetPlugin_v" + std::to_string(version)).c_str());
      if (table != nullptr) return {*static_cast<const char* const*>(table), "", version};
    }
    chosen.notFound += " " + file;
  }
  return chosen;
}

std::string debugFileName(const char* pattern) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string name;
  for (const char* at = pattern; *at != '\0'; ++at) {
    if (at[0] == '%' && at[1] == 'h') {
      name += host;
      ++at;
    } else if (at[0] == '%' && at[1] == 'p') {
      name += std::to_string(getpid());
      ++at;
    } else {
      name += *at;
    }
  }
  return name;
}

// NCCL's prefix: host:pid:tid [device] NCCL INFO
void logInfo(FILE* out, const std::string& message) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::fprintf(out, "%s:%d:%d [0] NCCL INFO %s\n", host, getpid(), gettid(), message.c_str());
}

void logNetwork(ncclComm_t comm, const Network& network, int rank, int nranks) {
  const char* level = std::getenv("NCCL_DEBUG");
  if (level == nullptr || (std::strcmp(level, "INFO") != 0 && std::strcmp(level, "TRACE") != 0)) return;
  const char* fileName = std::getenv("NCCL_DEBUG_FILE");
  FILE* out = fileName != nullptr ? std::fopen(debugFileName(fileName).c_str(), "a") : stdout;
  if (out == nullptr) return;
  int nodes = 1, localRanks = 1, localRank = 0;
  real<ncclResult_t (*)(ncclComm_t, int*, int*, int*)>("mojocclCommNodes")(comm, &nodes, &localRanks, &localRank);
  if (network.pluginVersion > 0) {
    logInfo(out, "NET/Plugin: Loaded net plugin " + network.name + " (v" + std::to_string(network.pluginVersion) +
                     ")");
  } else {
    logInfo(out, "NET/Plugin: Could not find:" + network.notFound + ". Using internal network plugin.");
  }
  logInfo(out, "Using network " + network.name);
  char span[160];
  std::snprintf(span, sizeof span, "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL 0",
                static_cast<void*>(comm), rank, nranks, nodes, localRanks, localRank);
  logInfo(out, span);
  if (nodes > 1 && localRank == 0) {  // the node's leader sends to the next node's
    char channel[160];
    std::snprintf(channel, sizeof channel, "Channel 00/0 : %d[0] -> %d[0] [send] via NET/%s/0", rank,
                  (rank + localRanks) % nranks, network.name.c_str());
    logInfo(out, channel);
  }
  if (out != stdout) std::fclose(out);
}

}  // namespace

EXPORT ncclResult_t ncclGetVersion(int* version) {
  return real<ncclResult_t (*)(int*)>("ncclGetVersion")(version);
}
EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  return real<ncclResult_t (*)(ncclUniqueId*)>("ncclGetUniqueId")(id);
}
EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  Network network = chooseNetwork();
  const char* forced = std::getenv("NCCL_NET");
  if (forced != nullptr && *forced != '\0' && network.name != forced) {
    std::fprintf(stderr, "NCCL WARN Error : network %s not found.\n", forced);
    return ncclInvalidUsage;  // as NCCL: a forced network that is not there fails the init
  }
  ncclResult_t result =
      real<ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int)>("ncclCommInitRank")(comm, nranks, id, rank);
  if (result == ncclSuccess) logNetwork(*comm, network, rank, nranks);
  return result;
}
EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return real<ncclResult_t (*)(ncclComm_t)>("ncclCommDestroy")(comm);
}
EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return real<ncclResult_t (*)(ncclComm_t)>("ncclCommAbort")(comm);
}
EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  {
    std::lock_guard<std::mutex> lock(errorsMutex);
    auto found = asyncErrors.find(comm);
    if (found != asyncErrors.end()) {
      *error = found->second;
      return ncclSuccess;
    }
  }
  return real<ncclResult_t (*)(ncclComm_t, ncclResult_t*)>("ncclCommGetAsyncError")(comm, error);
}
EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  return real<const char* (*)(ncclResult_t)>("ncclGetErrorString")(result);
}
EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  // libmojoccl keeps the text per thread: the stream's thread has it.
  return real<const char* (*)(ncclComm_t)>("ncclGetLastError")(comm);
}
EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return real<ncclResult_t (*)(const ncclComm_t, int*)>("ncclCommCount")(comm, count);
}
EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return real<ncclResult_t (*)(const ncclComm_t, int*)>("ncclCommUserRank")(comm, rank);
}

EXPORT ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                  ncclRedOp_t op, ncclComm_t comm, ncclStream_t stream) {
  static auto call = real<decltype(&ncclAllReduce)>("ncclAllReduce");
  return enqueue(comm, stream, [=] { return call(send, recv, count, type, op, comm, nullptr); });
}
EXPORT ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                                  int root, ncclComm_t comm, ncclStream_t stream) {
  static auto call = real<decltype(&ncclBroadcast)>("ncclBroadcast");
  return enqueue(comm, stream, [=] { return call(send, recv, count, type, root, comm, nullptr); });
}
EXPORT ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                                  ncclComm_t comm, ncclStream_t stream) {
  static auto call = real<decltype(&ncclAllGather)>("ncclAllGather");
  return enqueue(comm, stream, [=] { return call(send, recv, count, type, comm, nullptr); });
}
EXPORT ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count,
                                      ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                      ncclStream_t stream) {
  static auto call = real<decltype(&ncclReduceScatter)>("ncclReduceScatter");
  return enqueue(comm, stream, [=] { return call(send, recv, count, type, op, comm, nullptr); });
}
EXPORT ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, int root, ncclComm_t comm, ncclStream_t stream) {
  static auto call = real<decltype(&ncclReduce)>("ncclReduce");
  return enqueue(comm, stream, [=] { return call(send, recv, count, type, op, root, comm, nullptr); });
}
EXPORT ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                             ncclComm_t comm, ncclStream_t stream) {
  static auto call = real<decltype(&ncclSend)>("ncclSend");
  return enqueue(comm, stream, [=] { return call(send, count, type, peer, comm, nullptr); });
}
EXPORT ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer,
                             ncclComm_t comm, ncclStream_t stream) {
  static auto call = real<decltype(&ncclRecv)>("ncclRecv");
  return enqueue(comm, stream, [=] { return call(recv, count, type, peer, comm, nullptr); });
}

EXPORT ncclResult_t ncclGroupStart() {
  ++groupDepth;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd() {
  if (groupDepth == 0) return ncclInvalidUsage;
  if (--groupDepth > 0 || groupCalls.empty()) return ncclSuccess;
  // The group's calls run together on the stream, inside one library group.
  std::vector<Pending> calls;
  calls.swap(groupCalls);
  static auto start = real<decltype(&ncclGroupStart)>("ncclGroupStart");
  static auto end = real<decltype(&ncclGroupEnd)>("ncclGroupEnd");
  runOnStream(groupStream, [calls] {
    start();
    for (const auto& pending : calls) noteError(pending.comm, pending.call());
    noteError(calls.front().comm, end());
  });
  return ncclSuccess;
}
