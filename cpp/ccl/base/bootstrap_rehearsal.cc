// mojocclRehearseBootstrap (nccl.h): many ranks' bootstraps in threads of
// one process, each making the exchanges a set-up makes, so that set-up's
// growth can be measured past the ranks a machine's processes reach.
#include <string.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "base/bootstrap.h"
#include "base/error.h"
#include "base/settings.h"

namespace mojoccl {
namespace {

constexpr size_t kComparedBytes = 512;  // what Bootstrap::agreeOnSuccess compares

// Every rank starts at once, when the last thread is made: what is timed
// is the bootstrap, not the making of thousands of threads.
class StartingLine {
 public:
  Clock::time_point wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    started_.wait(lock, [&] { return open_; });
    return start_;
  }
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    start_ = Clock::now();
    started_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable started_;
  bool open_ = false;
  Clock::time_point start_;
};

void rehearseRank(const ncclUniqueId& id, const mojocclRehearsal& plan, int rank, StartingLine& line,
                  Rehearsed& result) {
  const auto start = line.wait();
  try {
    Bootstrap bootstrap(id, describeThisRank(rank), plan.nranks,
                        start + std::chrono::seconds(settingInt("MOJOCCL_BOOTSTRAP_TIMEOUT_S") + 10));
    if (rank == plan.leaver) return bootstrap.close();
    const size_t gatherBytes = plan.gathers > 0 ? plan.gatherBytes / plan.gathers : 0;
    std::vector<char> part(std::max(gatherBytes, kComparedBytes), static_cast<char>(rank));
    for (int round = 0; round < plan.rounds; ++round) {
      if (round < plan.gathers)
        bootstrap.allGather(part.data(), gatherBytes);
      else
        bootstrap.agreeOnSuccess(true, "");
    }
  } catch (const Error& error) {
    result.status = error.code();
    result.message = error.what();
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

std::vector<Rehearsed> rehearseBootstrap(const ncclUniqueId& id, const mojocclRehearsal& plan) {
  if (plan.nranks < 1 || plan.first < 0 || plan.count < 1 || plan.first + plan.count > plan.nranks ||
      plan.rounds < 0 || plan.gathers < 0 || plan.gathers > plan.rounds)
    fail(ncclInvalidArgument, "mojocclRehearseBootstrap: the plan's ranks or rounds are out of range");
  std::vector<Rehearsed> results(plan.count);
  StartingLine line;
  std::vector<std::thread> threads;
  for (int i = 0; i < plan.count; ++i)
    threads.emplace_back(rehearseRank, std::cref(id), std::cref(plan), plan.first + i, std::ref(line),
                         std::ref(results[i]));
  line.open();
  for (auto& thread : threads) thread.join();
  return results;
}

}  // namespace mojoccl
