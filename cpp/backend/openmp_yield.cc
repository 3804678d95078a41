#include "backend/openmp_yield.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <atomic>

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
thread_local bool holdsTeam = false;

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
  setThreads(team);
  if (at::get_num_threads() != team) {  // torch's threads are not this libgomp's
    setThreads(threads);
    teamHeld = false;
    return "";
  }
  // A region of torch's own (its inline parallel_for would run in this
  // file's code, built without OpenMP): every element-wise kernel splits
  // work in grains of at::internal::GRAIN_SIZE.
  at::empty({(team + 1) * at::internal::GRAIN_SIZE}, at::TensorOptions(at::kByte)).fill_(0);
  // torch work that later runs on this thread runs inline: a smaller team
  // here would let libgomp retire the idle threads.
  setThreads(1);
  holdsTeam = true;
  const int held = team - 1;
  return shared + "OpenMP's idle threads sleep instead of spinning (" + std::to_string(held) +
         " idle OpenMP thread" + (held == 1 ? "" : "s") + " held)";
}

void releaseOpenMpYield() {
  if (holdsTeam) teamHeld = false;
  holdsTeam = false;
}

}  // namespace torch_mojo
