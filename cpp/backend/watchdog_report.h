// What the watchdog (watchdog.cc) says of a group: a rank's whereabouts,
// exchanged through the store for a desync report; a timeout's headline;
// the report of the group's last collectives.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/process_group_mojo.hpp"

namespace torch_mojo::watchdog_report {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point then);
std::string seconds(double value);  // "2.5 s"

// What a rank says about itself in a desync report: "state\tsequence\twhat\tage".
struct Whereabouts {
  std::string state;  // "running", or how its last collective ended: "completed", "failed"
  uint64_t sequence = 0;
  std::string what;
  double age = 0;

  static Whereabouts of(ProcessGroupMojo& group) {
    auto health = group.health();
    if (health.running) return {"running", health.current.sequence, health.current.what,
                                secondsSince(health.current.issued)};
    if (health.recent.empty()) return {"completed", 0, "", 0};
    const auto& last = health.recent.back();
    bool failed = last.state == JobTrace::State::Failed;
    return {failed ? "failed" : "completed", last.sequence, last.what, 0};
  }
  std::string encode() const {
    return state + "\t" + std::to_string(sequence) + "\t" + what + "\t" + std::to_string(age);
  }
  static Whereabouts decode(const std::vector<uint8_t>& bytes) {
    std::vector<std::string> fields;
    std::stringstream stream(std::string(bytes.begin(), bytes.end()));
    for (std::string field; std::getline(stream, field, '\t');) fields.push_back(field);
    if (fields.size() < 4) return {};
    return {fields[0], std::stoull(fields[1]), fields[2], std::stod(fields[3])};
  }
  std::string describe() const {
    if (state == "running") return "#" + std::to_string(sequence) + " " + what + ", for " + seconds(age);
    if (sequence == 0) return "it has issued none";
    return "its last, #" + std::to_string(sequence) + " " + what + ", " + state;
  }
};

// Where, for request `epoch`, a rank puts its whereabouts and says it has dumped.
std::string statusKey(uint64_t epoch, int rank);
std::string dumpedKey(uint64_t epoch, int rank);
inline constexpr const char* kEpochKey = "mojo_watchdog/epoch";

// "[rank G] line" on stderr.
void say(int globalRank, const std::string& line);
// "rank 3" or "ranks 0, 2"
std::string ranks(const std::vector<int>& which);
// What collective #sequence was, from the group's recent ones.
std::string reportedWhat(const GroupHealth& health, uint64_t sequence);
std::string timeoutHeadline(const GroupHealth& health, double age, double timeout);
// The headline, then the last collectives issued, `sequence` marked with
// `outcome`; returns the group's health as it was printed.
GroupHealth reportCollectives(ProcessGroupMojo& group, const std::string& headline, uint64_t sequence,
                              const std::string& outcome);
// This rank's answer to a request: where it is, then its dump.
void answer(ProcessGroupMojo& group, uint64_t epoch);

}  // namespace torch_mojo::watchdog_report
