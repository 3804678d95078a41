// What a group keeps in torch's store (group_store.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/store_watch.h"

namespace torch_mojo {

// The first rank of a group publishes its communicator's id in the store;
// the others wait for it as long as libmojoccl waits for its peers, not the
// store's timeout (half an hour by default): `seconds`, libmojoccl's
// MOJOCCL_BOOTSTRAP_TIMEOUT_S.
void awaitUniqueId(c10d::Store& store, const std::string& key, int64_t seconds);

// torchrun keeps its store across the restarts of a job (--max-restarts),
// and torch's keys for a group are the same in every attempt: without a
// prefix of its own, a restarted rank could read the communicator id of
// the attempt before and wait for a rank that is gone.
c10::intrusive_ptr<c10d::Store> forThisAttempt(const c10::intrusive_ptr<c10d::Store>& store);

// The job's own store, without a group's prefix (but this attempt's): what
// one process says of itself there, every group can read. Where each
// global rank runs ("host H, pid P"), so that a rank that never checks in
// to a later group can still be named with its host; which ranks' processes
// are ending.
c10::intrusive_ptr<c10d::Store> jobStore(const c10::intrusive_ptr<c10d::Store>& store);

// Where the store under the groups' prefixes is a TCPStore, a watch on its server.
std::shared_ptr<StoreWatch> watchServerOf(const c10::intrusive_ptr<c10d::Store>& store);

// "host H, pid P" of a global rank, in the job's store.
std::string whereaboutsKey(uint64_t globalRank);

// The global ranks whose processes are ending, each appended as "R,": one
// key, read in one round trip however large the job.
std::set<uint64_t> exitingRanks(c10d::Store& job);

// Appends this global rank to those ending.
void sayExiting(c10d::Store& job, uint64_t globalRank);

// Sets this process's whereabouts.
void publishWhereabouts(c10d::Store& job, uint64_t globalRank);

}  // namespace torch_mojo
