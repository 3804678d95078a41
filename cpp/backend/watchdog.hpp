// The watchdog: one thread per process that watches every `mojo` process
// group (the guide's "A run hangs").
//
// When a collective outlives its group's timeout, or the collective library
// reports an error of its own (a dead peer, a closed connection), the
// watchdog of that rank
//   1. prints the report: the collective, its age, the last ones issued;
//   2. asks the group's other ranks, through the c10d store, where they are,
//      and prints the desync report (same collective / another / no report);
//   3. has every rank of the group dump its flight recorder;
//   4. with TORCH_MOJO_BACKEND_PG_WATCHDOG=abort (the default), aborts the
//      communicators and exits with status 1; with `report` it leaves the
//      process waiting; `off` turns all of this off.
// With `raise` it prints the report and dumps this rank's flight recorder
// only (a dead rank would not answer, and the others see the failure
// themselves), then the collective fails in its caller and the process
// goes on: a fatal library error is raised as it is, a collective past its
// timeout aborts its group first (else the call would never return).
// Other ranks answer such requests as they see them (every
// TORCH_NCCL_COORD_CHECK_MILSEC) and keep running.
//
// It also serves the dump pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE), and gives
// collectives still running when the script ends (Ctrl-C included) two
// seconds before reporting them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace torch_mojo {

class ProcessGroupMojo;

struct WatchdogSettings {
  enum class Mode { Abort, Raise, Report, Off };
  Mode mode;
  bool dumpOnTimeout;                            // TORCH_NCCL_DUMP_ON_TIMEOUT
  std::string pipeStem;                          // TORCH_NCCL_DEBUG_INFO_PIPE_FILE
  std::chrono::milliseconds waitForDumps;        // TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC
  std::chrono::milliseconds coordinationPeriod;  // TORCH_NCCL_COORD_CHECK_MILSEC
  bool onlyActive;                               // TORCH_INCLUDE_ONLY_ACTIVE

  // Read once, from the environment (validated by register_mojo_devices).
  static const WatchdogSettings& get();
};

class Watchdog {
 public:
  static Watchdog& get();

  void add(ProcessGroupMojo* group);
  void remove(ProcessGroupMojo* group);
  // A group saw a fatal library error: look at once.
  void wake();
  // At interpreter exit: collectives still running get two seconds, then
  // are reported like a timeout.
  void beforeExit();
  bool anyGroupAlive();

 private:
  Watchdog();
  void loop();
  void inspect(ProcessGroupMojo& group);
  void answerRequests(ProcessGroupMojo& group);
  // Report, desync report, dumps; then abort and exit (mode abort).
  // `outcome` marks the collective in the list: "timed out", "failed".
  void endTheRun(ProcessGroupMojo& group, const std::string& headline, uint64_t sequence,
                 const std::string& outcome);
  // Mode raise: the report and this rank's dump; the caller gets the error.
  void raiseInCaller(ProcessGroupMojo& group, const std::string& headline, uint64_t sequence,
                     const std::string& outcome);
  // Mode raise's dumps, on a thread of their own: a process's first dump
  // symbolizes its stacks for seconds, which neither the caller's recovery
  // (shrink_group removes the group from the watchdog) nor the next
  // failure's report should wait for.
  void dumpInBackground(int globalRank);
  void writeDumpsDue();
  void serveDumpPipe();
  void handleInterrupt();
  void handleTermination();

  std::mutex mutex_;  // guards groups_
  std::condition_variable wakeUp_;
  std::set<ProcessGroupMojo*> groups_;
  std::thread thread_;
  std::mutex dumpMutex_;  // guards dumpsDue_ and dumper_
  std::condition_variable dumpDue_;
  std::deque<int> dumpsDue_;  // global ranks
  std::thread dumper_;        // started at the first dump; runs until the process ends
  int pipe_ = -1;
  bool interruptHandled_ = false;
};

// Installed by register_mojo_devices(): Ctrl-C also reaches the watchdog, so
// that a rank blocked in a collective is released within seconds; SIGTERM
// makes it print what each group is doing and dump the flight recorder,
// then the process ends as SIGTERM ends it (unless the program has a
// SIGTERM handler of its own, which is called and decides).
void watchForInterrupts();

}  // namespace torch_mojo
