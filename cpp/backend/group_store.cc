// What a group keeps in torch's store: its communicator's id and who
// checked in to make it, where each rank runs, which ranks' processes are
// ending (the job's store, read by every group).
#include "backend/group_store.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "backend/environment.h"
#include "backend/process_group_mojo.hpp"

namespace torch_mojo {

void awaitUniqueId(c10d::Store& store, const std::string& key, int64_t seconds) {
  try {
    store.wait({key}, std::chrono::seconds(seconds));
  } catch (const c10::DistStoreError& error) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("the group's first rank did not publish its communicator in the store "
                             "within ", seconds, " s (MOJOCCL_BOOTSTRAP_TIMEOUT_S): it never "
                             "created the group, or the ranks disagree on who is in it (as after "
                             "shrink_group with different ranks_to_exclude) [", error.what_without_backtrace(), "]"));
  }
}

c10::intrusive_ptr<c10d::Store> forThisAttempt(const c10::intrusive_ptr<c10d::Store>& store) {
  const std::string attempt = environment("TORCHELASTIC_RESTART_COUNT");
  if (attempt.empty()) return store;
  return c10::make_intrusive<c10d::PrefixStore>("mojo_attempt_" + attempt, store);
}

c10::intrusive_ptr<c10d::Store> jobStore(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store.get());
  return forThisAttempt(prefixed != nullptr ? prefixed->getUnderlyingNonPrefixStore() : store);
}

std::shared_ptr<StoreWatch> watchServerOf(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store.get());
  auto base = prefixed != nullptr ? prefixed->getUnderlyingNonPrefixStore() : store;
  auto* tcp = dynamic_cast<c10d::TCPStore*>(base.get());
  return tcp != nullptr ? StoreWatch::of(tcp->getHost(), tcp->getPort()) : nullptr;
}

std::string whereaboutsKey(uint64_t globalRank) {
  return "torch_mojo_where/" + std::to_string(globalRank);
}

// The global ranks whose processes are ending, each appended as "R,": one
// key, read in one round trip however large the job.
constexpr const char* kExitingKey = "torch_mojo_exiting";

std::set<uint64_t> exitingRanks(c10d::Store& job) {
  std::set<uint64_t> ranks;
  if (!job.check({kExitingKey})) return ranks;
  std::vector<uint8_t> text = job.get(kExitingKey);
  uint64_t rank = 0;
  for (uint8_t c : text) {
    if (c == ',') {
      ranks.insert(rank);
      rank = 0;
    } else {
      rank = rank * 10 + (c - '0');
    }
  }
  return ranks;
}

void sayExiting(c10d::Store& job, uint64_t globalRank) {
  const std::string entry = std::to_string(globalRank) + ",";
  job.append(kExitingKey, std::vector<uint8_t>(entry.begin(), entry.end()));
}

void publishWhereabouts(c10d::Store& job, uint64_t globalRank) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  job.set(whereaboutsKey(globalRank), c10::str("host ", host, ", pid ", getpid()));
}

std::vector<int> ProcessGroupMojo::failedRanks() {
  std::vector<int> failed = host_->failedRanks();
  // The store, not the communicator, says who is ending: where a node's
  // first rank has left, the communicator no longer hears of that node.
  // Without a store to ask, the ranks that ended without leaving are what is known.
  try {
    const std::set<uint64_t> exiting =
        storeGone() ? std::set<uint64_t>{} : exitingRanks(*jobStore_);
    for (int rank = 0; rank < size_; ++rank)
      if (rank != rank_ && exiting.count(globalRanks_[rank])) failed.push_back(rank);
  } catch (const std::exception&) {
  }
  std::sort(failed.begin(), failed.end());
  failed.erase(std::unique(failed.begin(), failed.end()), failed.end());
  return failed;
}

void ProcessGroupMojo::createCommunicator(Communicator& comm, c10d::Store& store,
                                          const std::string& key) {
  // As ProcessGroupNCCL does: rank 0 makes the unique id, the store carries
  // it to the others. The store is already prefixed for this group. Each
  // rank checks in first, so that a creation that fails can say who never
  // came.
  store.set(key + "/checked_in/" + std::to_string(rank_), std::vector<uint8_t>{1});
  try {
    ncclUniqueId id{};
    if (rank_ == 0) {
      id = comm.newUniqueId();
      store.set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      awaitUniqueId(store, key, host_->library().settingInt("MOJOCCL_BOOTSTRAP_TIMEOUT_S"));
      std::vector<uint8_t> bytes = store.get(key);
      TORCH_CHECK(bytes.size() == sizeof(id.internal), "the unique id in the store has ",
                  bytes.size(), " bytes, expected ", sizeof(id.internal),
                  " (do all ranks run the same torch-mojo?)");
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    comm.init(id, size_, rank_);
  } catch (const CclError& error) {
    C10_THROW_ERROR(DistBackendError, neverCheckedIn(store, key) + error.what());
  } catch (const c10::DistBackendError& error) {
    C10_THROW_ERROR(DistBackendError, neverCheckedIn(store, key) + error.what_without_backtrace());
  }
}

std::string ProcessGroupMojo::neverCheckedIn(c10d::Store& store, const std::string& key) {
  std::string missing;
  try {
    auto& job = jobStore_;
    for (int rank = 0; rank < size_; ++rank) {
      if (store.check({key + "/checked_in/" + std::to_string(rank)})) continue;
      const uint64_t global = globalRanks_[rank];
      std::string where = "never seen";
      if (job->check({whereaboutsKey(global)})) {
        std::vector<uint8_t> text = job->get(whereaboutsKey(global));
        where = std::string(text.begin(), text.end());
      }
      missing += c10::str(missing.empty() ? "" : ", ", rank, " (global rank ", global, ", ", where, ")");
    }
  } catch (const std::exception&) {
    return "";  // the store is gone too (its host failed): the error alone says what happened
  }
  if (missing.empty()) return "";
  return c10::str("[rank ", globalRank(), "] the group of ", size_, " ranks was not created; ",
                  "rank(s) that never checked in: ", missing, ". ");
}

}  // namespace torch_mojo
