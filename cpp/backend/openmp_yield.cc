#include "backend/openmp_yield.h"

#include <dlfcn.h>
#include <sched.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

namespace torch_mojo {

namespace {

// Past this many idle threads a rank would rather be told to use fewer
// threads than hold them (and a node of many ranks would risk its limit
// on processes).
constexpr int kMostIdleThreads = 64;

std::atomic<bool> teamHeld{false};

// The CPUs libgomp counts: the process's affinity mask.
int cpusOfProcess() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

// omp_set_num_threads of the libgomp torch already loaded: never a second
// OpenMP runtime. It sets the calling thread's team size only.
using SetNumThreads = void (*)(int);
SetNumThreads torchsOpenMp() {
  void* libgomp = dlopen("libgomp.so.1", RTLD_NOLOAD | RTLD_LAZY);
  if (libgomp == nullptr) return nullptr;
  return reinterpret_cast<SetNumThreads>(dlsym(libgomp, "omp_set_num_threads"));
}

}  // namespace

std::string yieldOpenMpToOtherRanks(int ranksSharingCores, int sharedCpus) {
  const int threads = at::get_num_threads();  // torch's team size, this thread's from now on
  const int cpus = cpusOfProcess();            // what libgomp counts against
  // One thread never spins; more threads than CPUs already make libgomp yield.
  if (threads < 2 || threads > cpus || ranksSharingCores * threads <= sharedCpus) return "";
  const std::string shared = std::to_string(ranksSharingCores) + " ranks x " + std::to_string(threads) +
                             " torch threads share " + std::to_string(sharedCpus) + " CPUs: ";
  const int team = cpus - threads + 2;  // with torch's own team: one thread more than the CPUs
  static std::atomic<bool> advised{false};
  if (team > kMostIdleThreads + 1)
    return advised.exchange(true) ? "" : shared + "OpenMP's idle threads spin on the other ranks' cores; set OMP_NUM_THREADS=" +
           std::to_string(std::max(1, sharedCpus / ranksSharingCores)) + " (or bind each rank to cores of its own)";
  SetNumThreads setThreads = torchsOpenMp();
  if (setThreads == nullptr || teamHeld.exchange(true)) return "";
  static const int registered = pthread_atfork(nullptr, nullptr, [] { teamHeld = false; });  // a child has no holder
  (void)registered;
  std::promise<bool> held;
  std::future<bool> holding = held.get_future();
  // A thread of its own holds the team for the rest of the process: a
  // group's worker ends with its group, and torchft replaces its group at
  // every quorum (a new team each time took 5-15 ms of the group's set-up).
  std::thread([setThreads, team, held = std::move(held)]() mutable {
    setThreads(team);
    if (at::get_num_threads() != team) {  // torch's threads are not this libgomp's
      held.set_value(false);
      return;
    }
    // A region of torch's own (its inline parallel_for would run in this
    // file's code, built without OpenMP): every element-wise kernel splits
    // work in grains of at::internal::GRAIN_SIZE.
    at::empty({(team + 1) * at::internal::GRAIN_SIZE}, at::TensorOptions(at::kByte)).fill_(0);
    held.set_value(true);
    while (true) std::this_thread::sleep_for(std::chrono::hours(24));  // no state to tear down at exit
  }).detach();
  if (!holding.get()) {
    teamHeld = false;
    return "";
  }
  const int idle = team - 1;
  return shared + "OpenMP's idle threads sleep instead of spinning (" + std::to_string(idle) +
         " idle OpenMP thread" + (idle == 1 ? "" : "s") + " held)";
}

}  // namespace torch_mojo
