#include "backend/watchdog.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/environment.h"
#include "backend/flight_recorder.hpp"
#include "backend/process_group_mojo.hpp"
#include "backend/watchdog_report.h"

namespace torch_mojo {

using namespace watchdog_report;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kPeriod = milliseconds(100);
constexpr auto kWaitForReports = std::chrono::seconds(10);
constexpr auto kGraceAtExit = std::chrono::seconds(2);

std::atomic<bool> interrupted{false};
Clock::time_point interruptedAt;
struct sigaction previousSigint {};

void onSigint(int signal) {
  if (!interrupted.exchange(true)) interruptedAt = Clock::now();
  if (previousSigint.sa_handler != SIG_DFL && previousSigint.sa_handler != SIG_IGN)
    previousSigint.sa_handler(signal);
}

std::atomic<bool> terminated{false};
std::atomic<bool> watchdogRunning{false};  // else nobody would act on SIGTERM
struct sigaction previousSigterm {};

bool terminatesByDefault() { return previousSigterm.sa_handler == SIG_DFL; }

// The end, as SIGTERM's default action would have been.
void terminateNow() {
  signal(SIGTERM, SIG_DFL);
  raise(SIGTERM);
}

void onSigterm(int signal) {
  if (previousSigterm.sa_handler != SIG_DFL && previousSigterm.sa_handler != SIG_IGN)
    previousSigterm.sa_handler(signal);  // the program's own handler decides when to end
  if (previousSigterm.sa_handler == SIG_IGN) return;
  if (!watchdogRunning.load()) {
    if (terminatesByDefault()) terminateNow();
    return;
  }
  terminated.store(true);  // the watchdog reports, dumps, then ends the process
}

milliseconds millisecondsFrom(const char* name, milliseconds fallback) {
  std::string text = environment(name);
  return text.empty() ? fallback : milliseconds(std::atoll(text.c_str()));
}


}  // namespace

const WatchdogSettings& WatchdogSettings::get() {
  static const WatchdogSettings settings = [] {
    WatchdogSettings s{};
    std::string mode = environment("TORCH_MOJO_BACKEND_PG_WATCHDOG");
    s.mode = mode == "off"      ? Mode::Off
             : mode == "report" ? Mode::Report
             : mode == "raise"  ? Mode::Raise
                                : Mode::Abort;
    s.dumpOnTimeout = environment("TORCH_NCCL_DUMP_ON_TIMEOUT") != "0";
    s.pipeStem = environment("TORCH_NCCL_DEBUG_INFO_PIPE_FILE");
    s.waitForDumps = millisecondsFrom("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", milliseconds(15000));
    s.coordinationPeriod = millisecondsFrom("TORCH_NCCL_COORD_CHECK_MILSEC", milliseconds(1000));
    s.onlyActive = environment("TORCH_INCLUDE_ONLY_ACTIVE") == "1";
    return s;
  }();
  return settings;
}

Watchdog& Watchdog::get() {
  // Never destroyed: its thread runs until the process ends.
  static Watchdog* watchdog = new Watchdog();
  return *watchdog;
}

Watchdog::Watchdog() {
  thread_ = std::thread(&Watchdog::loop, this);
  watchdogRunning.store(true);
}

void Watchdog::add(ProcessGroupMojo* group) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.insert(group);
  if (pipe_ < 0 && !WatchdogSettings::get().pipeStem.empty()) {
    std::string path = WatchdogSettings::get().pipeStem + std::to_string(group->globalRank()) + ".pipe";
    mkfifo(path.c_str(), 0600);
    pipe_ = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  }
}

void Watchdog::remove(ProcessGroupMojo* group) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.erase(group);
}

void Watchdog::wake() { wakeUp_.notify_all(); }

bool Watchdog::anyGroupAlive() {
  std::lock_guard<std::mutex> lock(mutex_);
  return !groups_.empty();
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wakeUp_.wait_for(lock, kPeriod);
    std::vector<ProcessGroupMojo*> groups(groups_.begin(), groups_.end());
    // A group is removed only under mutex_; inspecting one keeps it alive
    // because remove() waits for this lock.
    for (ProcessGroupMojo* group : groups) inspect(*group);
    serveDumpPipe();
    if (interrupted.load() && !interruptHandled_) handleInterrupt();
    if (terminated.exchange(false)) handleTermination();
  }
}

void Watchdog::inspect(ProcessGroupMojo& group) {
  answerRequests(group);
  auto health = group.health();
  const bool raises = group.raisesInCaller() != nullptr;
  if (!health.failure.empty()) {
    const std::string headline = "collective #" + std::to_string(health.failed.sequence) + " (" +
                                 health.failed.what + ") failed: " + health.failure;
    if (raises)
      raiseInCaller(group, headline, health.failed.sequence, "failed");
    else
      endTheRun(group, headline, health.failed.sequence, "failed");
    return;
  }
  if (!health.running || group.reported(health.current.sequence)) return;
  double age = secondsSince(health.current.issued);
  double timeout = std::chrono::duration<double>(health.timeout).count();
  if (age < timeout) return;
  if (health.current.raisesOnTimeout || raises) {
    // A barrier fails in its caller, as gloo's does, and so does every
    // collective in mode raise: the caller decides. The group cannot be
    // trusted after it, so its communicator goes.
    if (raises)
      raiseInCaller(group, timeoutHeadline(health, age, timeout), health.current.sequence,
                    "timed out");
    group.markReported(health.current.sequence);
    group.noteTimeout();
    if (raises) group.runFailureHook();  // hooks that run on the way to an abort
    group.abortCommunicator(health.current.what + " (collective #" +
                            std::to_string(health.current.sequence) + ") Timed out after " +
                            seconds(age) + " (the timeout= of its group is " + seconds(timeout) +
                            "): a rank of the group did not reach it. The group is aborted: "
                            "destroy it (or shrink it) and make a new one to go on");
    return;
  }
  group.noteTimeout();
  endTheRun(group, timeoutHeadline(health, age, timeout), health.current.sequence, "timed out");
}

void Watchdog::raiseInCaller(ProcessGroupMojo& group, const std::string& headline,
                             uint64_t sequence, const std::string& outcome) {
  const auto& settings = WatchdogSettings::get();
  const int me = group.globalRank();
  group.markReported(sequence);
  reportCollectives(group, headline, sequence, outcome);
  say(me, std::string("The error is raised in the caller (") + group.raisesInCaller() +
              "); torch_mojo.distributed.failed_ranks() names the ranks known to have failed.");
  std::fflush(stderr);
  group.releaseFailedJob(sequence);
  if (settings.dumpOnTimeout && flight_recorder::enabled()) {
    group.recordGroupRanks();
    dumpInBackground(me);
  }
}

void Watchdog::answerRequests(ProcessGroupMojo& group) {
  if (!group.coordinationDue(WatchdogSettings::get().coordinationPeriod)) return;
  if (group.storeGone()) return;  // its host ended: nobody can ask any more
  try {
    uint64_t epoch = static_cast<uint64_t>(group.store().add(kEpochKey, 0));
    if (!group.newRequest(epoch)) return;
    answer(group, epoch);
  } catch (const std::exception&) {
    // The store failed between the look and the call.
  }
}

void Watchdog::endTheRun(ProcessGroupMojo& group, const std::string& headline, uint64_t sequence,
                         const std::string& outcome) {
  const auto& settings = WatchdogSettings::get();
  const int me = group.globalRank();
  group.markReported(sequence);
  auto health = reportCollectives(group, headline, sequence, outcome);

  // Ask the others where they are, and for their dumps.
  const auto started = Clock::now();
  const std::vector<uint64_t> globalRanks = group.globalRanks();
  std::map<int, Whereabouts> answers;
  try {
    if (group.storeGone())
      throw std::runtime_error("its server (the process that hosted it) has ended");
    c10d::Store& store = group.store();
    uint64_t epoch = static_cast<uint64_t>(store.add(kEpochKey, 1));
    group.newRequest(epoch);  // our own request: answered here, not by answerRequests
    answer(group, epoch);
    while (Clock::now() - started < kWaitForReports) {
      for (int rank = 0; rank < group.getSize(); ++rank)
        if (!answers.count(rank) && store.check({statusKey(epoch, rank)}))
          answers[rank] = Whereabouts::decode(store.get(statusKey(epoch, rank)));
      if (static_cast<int>(answers.size()) == group.getSize()) break;
      std::this_thread::sleep_for(kPeriod);
    }
    std::vector<int> same, missing;
    std::vector<std::string> elsewhere, idle;
    const std::string target = health.current.sequence == sequence ? health.current.what : reportedWhat(health, sequence);
    for (int rank = 0; rank < group.getSize(); ++rank) {
      if (rank == group.getRank()) continue;
      int global = static_cast<int>(globalRanks[rank]);
      auto found = answers.find(rank);
      if (found == answers.end())
        missing.push_back(global);
      else if (found->second.state != "running")
        idle.push_back("rank " + std::to_string(global) + " (" + found->second.describe() + ")");
      else if (found->second.sequence == sequence && found->second.what == target)
        same.push_back(global);
      else
        elsewhere.push_back("rank " + std::to_string(global) + " (" + found->second.describe() + ")");
    }
    say(me, "Desync report for collective #" + std::to_string(sequence) + " (" + target +
                ") of a group of " + std::to_string(group.getSize()) + " ranks, from rank " +
                std::to_string(me) + ":");
    if (!same.empty()) say(me, "  waiting in the same collective: " + ranks(same));
    for (const auto& line : elsewhere) say(me, "  in another collective: " + line);
    for (const auto& line : idle) say(me, "  not in a collective: " + line);
    if (!missing.empty())
      say(me, "  sent no report within " +
                  seconds(std::chrono::duration<double>(kWaitForReports).count()) + ": " + ranks(missing));
    if (!missing.empty() || !idle.empty())
      say(me, "  => a rank that is not in this collective, or sent no report, usually never "
              "issued it or is blocked elsewhere (py-spy dump --pid <pid> shows where): look there "
              "first.");
    else if (!elsewhere.empty())
      say(me, "  => the ranks did not issue the same collectives in the same order.");
    else
      say(me, "  => every rank is in this collective: this report cannot tell why it does not "
              "complete (a rank may be slow, or point-to-point transfers may not match).");
    std::fflush(stderr);
    // The dumps, from every rank that can still write one.
    if (settings.dumpOnTimeout && flight_recorder::enabled()) {
      while (Clock::now() - started < settings.waitForDumps) {
        bool all = true;
        for (int rank = 0; rank < group.getSize() && all; ++rank)
          all = !answers.count(rank) || store.check({dumpedKey(epoch, rank)});
        if (all) break;
        std::this_thread::sleep_for(kPeriod);
      }
    }
  } catch (const std::exception& error) {
    say(me, std::string("  (no desync report: the store is unreachable: ") + error.what() + ")");
  }
  if (settings.dumpOnTimeout && flight_recorder::enabled()) {
    group.recordGroupRanks();
    say(me, "Flight recorder dumped to " + flight_recorder::writeDump(me, settings.onlyActive));
  }
  std::fflush(stderr);

  if (settings.mode != WatchdogSettings::Mode::Abort) {
    group.releaseFailedJob(sequence);
    return;
  }
  group.runFailureHook();
  say(me, "Aborting the communicators and exiting with status 1 "
          "(TORCH_MOJO_BACKEND_PG_WATCHDOG=report would leave the process waiting).");
  std::fflush(stderr);
  for (ProcessGroupMojo* each : groups_) each->abortCommunicator();
  _exit(1);
}

void Watchdog::dumpInBackground(int globalRank) {
  std::lock_guard<std::mutex> lock(dumpMutex_);
  dumpsDue_.push_back(globalRank);
  if (!dumper_.joinable()) dumper_ = std::thread(&Watchdog::writeDumpsDue, this);
  dumpDue_.notify_all();
}

void Watchdog::writeDumpsDue() {
  std::unique_lock<std::mutex> lock(dumpMutex_);
  while (true) {
    dumpDue_.wait(lock, [this] { return !dumpsDue_.empty(); });
    const int rank = dumpsDue_.front();
    lock.unlock();
    say(rank, "Flight recorder dumped to " +
                  flight_recorder::writeDump(rank, WatchdogSettings::get().onlyActive));
    std::fflush(stderr);
    lock.lock();
    dumpsDue_.pop_front();  // only now: beforeExit waits for the dump being written
    dumpDue_.notify_all();
  }
}

void Watchdog::serveDumpPipe() {
  if (pipe_ < 0) return;
  pollfd entry{pipe_, POLLIN, 0};
  if (poll(&entry, 1, 0) <= 0 || !(entry.revents & (POLLIN | POLLHUP))) return;
  char buffer[256];
  bool requested = false;
  ssize_t got;
  while ((got = read(pipe_, buffer, sizeof(buffer))) > 0) requested = true;
  if (requested && !groups_.empty() && flight_recorder::enabled()) {
    int rank = (*groups_.begin())->globalRank();
    say(rank, "Flight recorder dumped to " +
                  flight_recorder::writeDump(rank, WatchdogSettings::get().onlyActive) +
                  " (asked through the debug pipe)");
  }
}

void Watchdog::handleInterrupt() {
  // Ctrl-C: the main thread may be inside a collective and cannot raise
  // KeyboardInterrupt until it returns. Give running collectives the grace
  // period, then report them and release the calls.
  if (Clock::now() - interruptedAt < kGraceAtExit) return;
  interruptHandled_ = true;
  for (ProcessGroupMojo* group : groups_) {
    auto health = group->health();
    if (!health.running) continue;
    group->markReported(health.current.sequence);
    say(group->globalRank(), "collective #" + std::to_string(health.current.sequence) + " (" +
                                 health.current.what + ") was still running 2 s after Ctrl-C "
                                 "(SIGINT); releasing it so that the script can stop");
    group->abortCommunicator();
  }
  std::fflush(stderr);
}

void Watchdog::handleTermination() {
  // SIGTERM: a time limit, scancel, torchrun stopping its workers. What each
  // group was doing, then this process's dump, before the process ends.
  int rank = -1;
  for (ProcessGroupMojo* group : groups_) {
    rank = group->globalRank();
    say(rank, "SIGTERM (a time limit, scancel, or the launcher stopping the job): group " +
                  group->getGroupDesc() + ": " + Whereabouts::of(*group).describe());
  }
  const auto& settings = WatchdogSettings::get();
  if (rank >= 0 && flight_recorder::enabled()) {
    for (ProcessGroupMojo* group : groups_) group->recordGroupRanks();
    say(rank, "Flight recorder dumped to " + flight_recorder::writeDump(rank, settings.onlyActive));
  }
  std::fflush(stderr);
  if (terminatesByDefault()) terminateNow();
}

void Watchdog::beforeExit() {
  {
    // A dump still being written reads the interpreter's stacks: it ends
    // before the interpreter does.
    std::unique_lock<std::mutex> lock(dumpMutex_);
    dumpDue_.wait_for(lock, WatchdogSettings::get().waitForDumps, [this] { return dumpsDue_.empty(); });
  }
  std::unique_lock<std::mutex> lock(mutex_);
  const auto deadline = Clock::now() + kGraceAtExit;
  for (ProcessGroupMojo* group : groups_) {
    while (group->health().busy && Clock::now() < deadline) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      lock.lock();
    }
    auto health = group->health();
    if (!health.busy || group->reported(health.current.sequence)) continue;
    group->markReported(health.current.sequence);
    say(group->globalRank(), "collective #" + std::to_string(health.current.sequence) + " (" +
                                 health.current.what +
                                 ") is still running 2 s after the script ended; it never completed");
    if (WatchdogSettings::get().dumpOnTimeout && flight_recorder::enabled()) {
      group->recordGroupRanks();
      say(group->globalRank(), "Flight recorder dumped to " +
                                   flight_recorder::writeDump(group->globalRank(),
                                                              WatchdogSettings::get().onlyActive));
    }
    // Releases the running call and fails the queued ones, so that the
    // group can be torn down with the interpreter.
    group->abortCommunicator();
  }
  std::fflush(stderr);
}

void watchForInterrupts() {
  static std::once_flag once;
  std::call_once(once, [] {
    // A signal the process was started ignoring (nohup, a background job
    // of a script) stays ignored.
    auto takeOver = [](int number, void (*handler)(int), struct sigaction* previous) {
      sigaction(number, nullptr, previous);
      if (previous->sa_handler == SIG_IGN) return;
      struct sigaction ours {};
      ours.sa_handler = handler;
      sigemptyset(&ours.sa_mask);
      sigaction(number, &ours, previous);
    };
    takeOver(SIGINT, onSigint, &previousSigint);
    takeOver(SIGTERM, onSigterm, &previousSigterm);
  });
}

}  // namespace torch_mojo
