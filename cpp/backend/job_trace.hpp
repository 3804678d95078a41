// What the watchdog (watchdog.cc) knows of a process group: each job's
// trace (what it is, when it was issued, how far it got) and the group's
// health (the job running, the last ones issued, a fatal error). The
// group keeps them (work_queue.cc); the watchdog reads a copy.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace torch_mojo {

// One job of a group, as reports name it.
struct JobTrace {
  using Clock = std::chrono::steady_clock;
  enum class State { Queued, Running, Completed, Failed };
  uint64_t sequence = 0;
  std::string what;  // "all_reduce 1024 x float32 sum"
  Clock::time_point issued;
  State state = State::Queued;
  std::string device = "cpu";  // where its tensors are: "cpu", "cuda:0", ...
  // A barrier past its timeout fails in its caller (as gloo's does)
  // instead of ending the run.
  bool raisesOnTimeout = false;
};

// A group as the watchdog sees it at one moment.
struct GroupHealth {
  bool running;
  bool busy;                     // running, or jobs queued
  JobTrace current;              // the running job, else the first queued one
  std::vector<JobTrace> recent;  // the last ones issued, oldest first
  std::string failure;           // a fatal library error, with...
  JobTrace failed;               // ...the job that hit it
  std::chrono::milliseconds timeout;
};

}  // namespace torch_mojo
