#include "backend/watchdog_report.h"

#include <cstdio>

#include "backend/flight_recorder.hpp"
#include "backend/watchdog.hpp"

namespace torch_mojo::watchdog_report {

double secondsSince(Clock::time_point then) {
  return std::chrono::duration<double>(Clock::now() - then).count();
}

std::string seconds(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", value);
  return text;
}

std::string statusKey(uint64_t epoch, int rank) {
  return "mojo_watchdog/" + std::to_string(epoch) + "/where/" + std::to_string(rank);
}
std::string dumpedKey(uint64_t epoch, int rank) {
  return "mojo_watchdog/" + std::to_string(epoch) + "/dumped/" + std::to_string(rank);
}

void say(int globalRank, const std::string& line) {
  std::fprintf(stderr, "[rank %d] %s\n", globalRank, line.c_str());
}

std::string ranks(const std::vector<int>& which) {
  std::string text;
  for (int rank : which) text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return (which.size() == 1 ? "rank " : "ranks ") + text;
}

std::string reportedWhat(const GroupHealth& health, uint64_t sequence) {
  for (const auto& trace : health.recent)
    if (trace.sequence == sequence) return trace.what;
  return health.failed.what;
}

std::string timeoutHeadline(const GroupHealth& health, double age, double timeout) {
  return "Watchdog caught collective operation timeout: collective #" +
         std::to_string(health.current.sequence) + " (" + health.current.what + ") on " +
         health.current.device + " has not completed " + seconds(age) +
         " after it was issued (timeout " + seconds(timeout) +
         ", the timeout= of init_process_group).";
}

GroupHealth reportCollectives(ProcessGroupMojo& group, const std::string& headline,
                              uint64_t sequence, const std::string& outcome) {
  const int me = group.globalRank();
  auto health = group.health();
  say(me, headline);
  // The group's device; collectives of its other device say where they ran.
  std::string device = "cpu";
  for (const auto& trace : health.recent)
    if (trace.sequence == sequence) device = trace.device;
  say(me, "  last collectives issued on " + device + ", oldest first:");
  for (const auto& trace : health.recent) {
    std::string state = trace.state == JobTrace::State::Completed ? "completed"
                        : trace.state == JobTrace::State::Failed  ? "failed"
                        : trace.state == JobTrace::State::Queued  ? "queued"
                                                                  : "pending for " + seconds(secondsSince(trace.issued));
    say(me, "    #" + std::to_string(trace.sequence) + " " + trace.what +
                (trace.device != device ? " on " + trace.device : "") + "  " + state +
                (trace.sequence == sequence ? "  <-- " + outcome : ""));
  }
  std::fflush(stderr);
  return health;
}

void answer(ProcessGroupMojo& group, uint64_t epoch) {
  const auto& settings = WatchdogSettings::get();
  c10d::Store& store = group.store();
  std::string where = Whereabouts::of(group).encode();
  store.set(statusKey(epoch, group.getRank()), std::vector<uint8_t>(where.begin(), where.end()));
  if (settings.dumpOnTimeout && flight_recorder::enabled()) {
    group.recordGroupRanks();
    flight_recorder::writeDump(group.globalRank(), settings.onlyActive);
    store.set(dumpedKey(epoch, group.getRank()), std::vector<uint8_t>{'1'});
  }
}

}  // namespace torch_mojo::watchdog_report
