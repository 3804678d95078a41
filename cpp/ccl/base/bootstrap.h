// The TCP bootstrap that brings a communicator's ranks together.
//
// ncclGetUniqueId() starts a root thread listening on this host's bootstrap
// address; the unique id carries that address and a random secret. Every
// rank of ncclCommInitRank connects to the root and proves it knows the
// secret (and the job key, seal.h). The root answers rank 0 with the table
// of all ranks and every other rank with its parent's address in a tree of
// the ranks (bootstrap_wire.h), and is done. Until the communicator is set
// up the ranks exchange over the tree: all-gathers (shared-memory names,
// fabric addresses) and comparisons answered with a verdict (settings,
// set-up errors), each up the tree and back down.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/seal.h"
#include "base/socket.h"
#include "mojoccl/nccl.h"

namespace mojoccl {

// A rank of the bootstrap's tree with the ranks below it: [rank, end).
struct Subtree {
  int rank;
  int end;
};

struct RankInfo {
  int32_t rank;
  int32_t pid;
  uint64_t hostHash;  // ranks with equal hashes share a node (MOJOCCL_HOSTID overrides)
  char hostname[64];
  uint64_t cpus[16];  // the CPUs it may run on (its affinity mask, 1,024 of them)
};

// A new unique id, with its root thread already listening.
ncclUniqueId createUniqueId();

// This process's RankInfo.
RankInfo describeThisRank(int rank);

// What each rank of mojocclRehearseBootstrap saw (nccl.h).
struct Rehearsed {
  double seconds = 0;
  int status = 0;
  std::string message;
};
std::vector<Rehearsed> rehearseBootstrap(const ncclUniqueId& id, const mojocclRehearsal& plan);

class Bootstrap {
 public:
  // Connects to the root named in `id` and waits for every rank to check in.
  Bootstrap(const ncclUniqueId& id, const RankInfo& mine, int nranks, Deadline deadline);

  const std::vector<RankInfo>& ranks() const { return ranks_; }
  // What the communicator's ranks prove they belong with (seal.h).
  const SealKeys& keys() const { return keys_; }

  // Every rank contributes `bytes` (the same on every rank); the result holds
  // all contributions in rank order.
  std::vector<char> allGather(const void* mine, size_t bytes);

  // Every rank contributes `bytes`; the root compares them with rank 0's and
  // answers with the first rank whose part differs (-1: none), rank 0's
  // part and that rank's. What an agreement needs, in a reply of a few
  // hundred bytes where an all-gather's grows with the ranks.
  struct Difference {
    int rank;
    std::vector<char> rankZeros;
    std::vector<char> theirs;  // empty where none differs
  };
  Difference firstDifference(const void* mine, size_t bytes);

  // Shares a set-up failure: every rank fails together, the message of the
  // lowest failing rank first. Call with ok=true to learn of others' failures.
  void agreeOnSuccess(bool ok, const std::string& failure);

  // Every rank's `value` of the setting `name` must be the same (ranks
  // that chose differently would not meet): otherwise every rank fails,
  // naming the first two that differ.
  void requireSameSetting(const std::string& name, const std::string& value) { requireSameSettings({{name, value}}); }
  // The same for several (name, value) pairs, in one exchange.
  void requireSameSettings(const std::vector<std::pair<std::string, std::string>>& settings);

  void close();

  // The exchanges over the tree since the table, and the bytes this rank
  // put into the all-gathers among them (every rank receives every rank's
  // part of those): what set-up's time grows with.
  int rounds() const { return rounds_; }
  uint64_t bytesGathered() const { return bytesGathered_; }

 private:
  // What an exchange brings: data, or a failure (a non-zero ncclResult_t
  // and its message in `data`).
  struct Outcome {
    int32_t status;
    std::vector<char> data;
    static Outcome failed(int32_t status, const std::string& why) { return {status, {why.begin(), why.end()}}; }
  };
  struct Child {
    Subtree subtree;
    Socket socket;
  };

  void connectToParent(const std::vector<char>& rootsAnswer);
  void acceptChildren(Socket& listener, const std::vector<Subtree>& children);
  std::vector<char> exchange(const void* mine, size_t bytes, bool compare);
  Outcome gatherSubtree(const char* mine, size_t bytes, bool compare);
  Outcome passUp(const Outcome& subtree, size_t bytes, bool compare);
  Outcome fromParent(size_t bytes, bool compare);
  void handDown(const Outcome& result, size_t bytes, bool compare);

  std::vector<RankInfo> ranks_;
  SealKeys keys_;
  Deadline deadline_;
  int rank_;
  int parentRank_ = -1;
  Socket parent_;
  std::vector<Child> children_;
  Rejections rejections_{"a rank's bootstrap listener"};
  int rounds_ = 0;
  uint64_t bytesGathered_ = 0;
};

}  // namespace mojoccl
