// How a group fails and ends: the error a failed job raises, what the
// watchdog (watchdog.cc) reads of the group and does to it, abort() and
// shutdown().
#include "backend/process_group_mojo.hpp"

#include <algorithm>

#include <c10/util/Exception.h>

#include "backend/flight_recorder.hpp"
#include "backend/tensors.h"
#include "backend/watchdog.hpp"

namespace torch_mojo {

std::exception_ptr ProcessGroupMojo::classify(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const CclError& failure) {
    // Invalid usage (a mismatch, a bad argument) is the caller's to handle;
    // anything else means the ranks are no longer in step: the watchdog's.
    if (failure.code != ncclInvalidUsage && failure.code != ncclInvalidArgument) {
      std::lock_guard<std::mutex> lock(mutex_);
      fatalError_ = failure.what();
      // The first error is the one getError() tells (an abort after a
      // timeout makes the calls fail as well).
      auto none = c10d::ErrorType::SUCCESS;
      error_.compare_exchange_strong(none, failure.code == ncclRemoteError
                                               ? c10d::ErrorType::REMOTE_ERROR
                                               : c10d::ErrorType::COMM_ERROR);
    }
    return distBackendError(failure.what());
  } catch (...) {
    return error;
  }
}

GroupHealth ProcessGroupMojo::health() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A device job in flight was issued before the one running on the host.
  const bool running = running_ || !inFlight_.empty();
  GroupHealth health{running,  running || !queue_.empty(), {}, {history_.begin(), history_.end()},
                     failure_, failed_,                    timeout_.load()};
  if (!inFlight_.empty()) {
    health.current = traceOf(inFlight_.front());
  } else if (running_) {
    const JobTrace* recorded = traceOf(runningSequence_);
    health.current = recorded != nullptr ? *recorded : runningTrace_;
  } else if (!queue_.empty()) {
    health.current = traceOf(queue_.front());
  }
  return health;
}

bool ProcessGroupMojo::reported(uint64_t sequence) {
  std::lock_guard<std::mutex> lock(mutex_);
  return sequence <= reportedUpTo_;
}

void ProcessGroupMojo::markReported(uint64_t sequence) {
  std::lock_guard<std::mutex> lock(mutex_);
  reportedUpTo_ = std::max(reportedUpTo_, sequence);
  failure_.clear();
}

const char* ProcessGroupMojo::raisesInCaller() const {
  if (WatchdogSettings::get().mode == WatchdogSettings::Mode::Raise)
    return "TORCH_MOJO_BACKEND_PG_WATCHDOG=raise";
  return raisingOwner_.load();
}

void ProcessGroupMojo::onFailure(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  failureHook_ = std::move(hook);
}

void ProcessGroupMojo::runFailureHook() {
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    hook = failureHook_;
  }
  if (hook) hook();
}

void ProcessGroupMojo::releaseFailedJob(uint64_t sequence) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    releasedUpTo_ = std::max(releasedUpTo_, sequence);
  }
  failureReported_.notify_all();
}

bool ProcessGroupMojo::coordinationDue(std::chrono::milliseconds period) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto now = Clock::now();
  if (now - lastCoordination_ < period) return false;
  lastCoordination_ = now;
  return true;
}

bool ProcessGroupMojo::newRequest(uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (epoch <= epochSeen_) return false;
  epochSeen_ = epoch;
  return true;
}

void ProcessGroupMojo::recordGroupRanks() {
  std::call_once(ranksRecorded_, [this] {
    flight_recorder::recordGroupRanks({getGroupUid(), getGroupDesc()}, globalRanks_);
  });
}

void ProcessGroupMojo::abortCommunicator(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!host_->initialised() || aborted_) return;
    aborted_ = true;
    abortReason_ = c10::str("[rank ", globalRank(), "] ", reason);
  }
  host_->abort();
  if (device_) device_->comm->abort();
}

void ProcessGroupMojo::stopThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  workAvailable_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void ProcessGroupMojo::abort() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!host_->initialised()) return;
    if (!aborted_) abortReason_ = c10::str("[rank ", rank_, "] the process group was aborted");
    aborted_ = true;
  }
  host_->abort();
  if (device_) device_->comm->abort();
  stopThreads();
  if (watched_) Watchdog::get().remove(this);
  closeCommunicators();
}

void ProcessGroupMojo::shutdown() {
  if (!host_ || !host_->initialised()) return;
  stopThreads();  // lets queued collectives (and those on the device) finish first
  if (watched_) Watchdog::get().remove(this);
  closeCommunicators();
}

void ProcessGroupMojo::closeCommunicators() {
  // An aborted communicator is only forgotten (Communicator::destroy).
  host_->destroy();
  if (device_) device_->comm->destroy();
}

}  // namespace torch_mojo
