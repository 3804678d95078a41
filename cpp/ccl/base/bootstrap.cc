// A rank's side of the bootstrap: its hello to the root, its place in the
// tree, and the exchanges over the tree. An exchange goes up the tree
// (each rank joins its children's parts to its own, or judges them) and
// its result comes back down: about log8(n) steps, and no rank handles
// more than its parent and eight children.
#include "base/bootstrap.h"

#include <sched.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "base/bootstrap_wire.h"
#include "base/error.h"
#include "base/seal.h"
#include "base/settings.h"

namespace mojoccl {
namespace {

// A comparison's answer as it travels up: the first rank of the subtree
// whose part differs from the subtree's first rank's (-1 where none does),
// then the first rank's part and, where one differs, that rank's. At the
// top the first rank is rank 0: the answer is the Difference every rank gets.
struct Verdict {
  int32_t differing;
};

constexpr auto kTimeToTell = std::chrono::seconds(5);  // to pass a failure on, past the deadline

uint64_t hashString(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// The root's answer; throws its message where it reports a failure.
std::vector<char> readRootAnswer(Socket& root, Deadline deadline) {
  wire::Message header{};
  std::vector<char> data;
  if (!wire::receiveMessage(root, header, data, deadline))
    fail(ncclRemoteError, "the bootstrap root closed the connection (the process that "
                          "called ncclGetUniqueId exited or failed)");
  if (header.status != 0) fail(static_cast<ncclResult_t>(header.status), std::string(data.begin(), data.end()));
  return data;
}

std::vector<char> verdictOf(const char* part, size_t bytes) {
  std::vector<char> verdict(sizeof(Verdict));
  const Verdict none{-1};
  memcpy(verdict.data(), &none, sizeof(none));
  verdict.insert(verdict.end(), part, part + bytes);
  return verdict;
}

int32_t differingIn(const std::vector<char>& verdict) {
  Verdict read{};
  memcpy(&read, verdict.data(), sizeof(read));
  return read.differing;
}

// Joins the verdict of a later subtree, whose first rank is `first`, to
// that of the ranks before it: the earlier difference stands; else the
// later subtree's first part, where it differs; else its own difference.
void joinVerdicts(std::vector<char>& earlier, const std::vector<char>& later, int first, size_t bytes) {
  if (differingIn(earlier) >= 0) return;
  const char* ours = earlier.data() + sizeof(Verdict);
  const char* theirs = later.data() + sizeof(Verdict);
  Verdict joined{-1};
  if (memcmp(ours, theirs, bytes) != 0) {
    joined.differing = first;
  } else if (differingIn(later) >= 0) {
    joined.differing = differingIn(later);
    theirs += bytes;
  } else {
    return;
  }
  memcpy(earlier.data(), &joined, sizeof(joined));
  earlier.insert(earlier.end(), theirs, theirs + bytes);
}

// How many bytes a child's message for an exchange must hold.
bool sizedRight(const std::vector<char>& data, size_t bytes, bool compare, const Subtree& child) {
  if (!compare) return data.size() == bytes * static_cast<size_t>(child.end - child.rank);
  if (data.size() < sizeof(Verdict)) return false;
  return data.size() == sizeof(Verdict) + bytes * (differingIn(data) >= 0 ? 2 : 1);
}

}  // namespace

RankInfo describeThisRank(int rank) {
  RankInfo info{};
  info.rank = rank;
  info.pid = getpid();
  gethostname(info.hostname, sizeof(info.hostname) - 1);
  std::string hostId = settingText("MOJOCCL_HOSTID");
  if (hostId.empty()) {
    std::string bootId;
    std::ifstream("/proc/sys/kernel/random/boot_id") >> bootId;
    hostId = std::string(info.hostname) + "/" + bootId;
  }
  info.hostHash = hashString(hostId);
  cpu_set_t cpus;
  static_assert(sizeof(info.cpus) == sizeof(cpus), "RankInfo::cpus holds a cpu_set_t");
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) memcpy(info.cpus, &cpus, sizeof(cpus));
  return info;
}

Bootstrap::Bootstrap(const ncclUniqueId& id, const RankInfo& mine, int nranks, Deadline deadline)
    : deadline_(deadline), rank_(mine.rank) {
  wire::IdContents contents{};
  memcpy(&contents, id.internal, sizeof(contents));
  if (contents.magic != wire::kMagic || !contents.root.valid())
    fail(ncclInvalidArgument, "the unique id was not made by libmojoccl's ncclGetUniqueId "
                              "(is every rank loading the same collective library?)");
  keys_ = deriveSealKeys(contents.secret);
  const wire::TreeLinks links = wire::treeLinks(rank_, nranks);
  parentRank_ = links.parent;

  Socket listener;
  wire::PackedAddress listening{};
  if (!links.children.empty()) {
    SocketAddress address = chooseBootstrapAddress();
    listener = Socket::listenOn(address);
    listening = wire::PackedAddress::of(address);
  }
  Socket root = Socket::connectTo(contents.root.unpack(), deadline);
  const wire::Hello hello{wire::kMagic, keys_.hello, nranks, mine, listening};
  root.sendAll(&hello, sizeof(hello), deadline);
  std::vector<char> answer = readRootAnswer(root, deadline);
  root.close();

  if (parentRank_ >= 0) connectToParent(answer);
  acceptChildren(listener, links.children);
  // The table comes down the tree from rank 0, which the root gave it.
  Outcome table = parentRank_ < 0 ? Outcome{0, std::move(answer)} : fromParent(sizeof(RankInfo), false);
  handDown(table, sizeof(RankInfo), false);
  if (table.data.size() != nranks * sizeof(RankInfo))
    fail(ncclInternalError, "the bootstrap's table of ranks has the wrong size");
  ranks_.resize(nranks);
  memcpy(ranks_.data(), table.data.data(), table.data.size());
}

void Bootstrap::connectToParent(const std::vector<char>& answer) {
  wire::PackedAddress parent{};
  if (answer.size() != sizeof(parent)) fail(ncclInternalError, "the bootstrap root sent a parent's address of the wrong size");
  memcpy(&parent, answer.data(), sizeof(parent));
  parent_ = Socket::connectTo(parent.unpack(), deadline_);
  const wire::TreeHello hello{wire::kMagic, keys_.hello, rank_, 0};
  parent_.sendAll(&hello, sizeof(hello), deadline_);
}

// Takes the connections of this rank's children, each of which proves it
// holds the unique id and names its rank; any other is closed and counted.
void Bootstrap::acceptChildren(Socket& listener, const std::vector<Subtree>& children) {
  children_.resize(children.size());
  size_t joined = 0;
  auto turnAway = [&](Socket& socket, const std::string& why) {
    rejections_.record("a connection from " + socket.peerName() + " (" + why + ")");
  };
  auto greeted = [&](Socket& socket, const std::vector<char>& greeting) {
    wire::TreeHello said;
    memcpy(&said, greeting.data(), sizeof(said));
    auto child = std::find_if(children.begin(), children.end(), [&](const Subtree& c) { return c.rank == said.rank; });
    if (said.magic != wire::kMagic || said.proof != keys_.hello) return turnAway(socket, "not of this communicator");
    const size_t index = child - children.begin();
    if (child == children.end() || children_[index].socket.valid())
      return turnAway(socket, "it claimed rank " + std::to_string(said.rank) + ", not a child still expected");
    children_[index] = {*child, std::move(socket)};
    ++joined;
  };
  if (children.empty()) return;
  if (!acceptGreeted(listener, sizeof(wire::TreeHello), deadline_, [&] { return joined == children.size(); }, greeted,
                     turnAway))
    fail(ncclRemoteError, "rank " + std::to_string(rank_) + "'s children in the bootstrap's tree did not all connect "
                          "within MOJOCCL_BOOTSTRAP_TIMEOUT_S (a rank failed after joining)");
}

std::vector<char> Bootstrap::exchange(const void* mine, size_t bytes, bool compare) {
  ++rounds_;
  if (!compare) bytesGathered_ += bytes;
  Outcome result = gatherSubtree(static_cast<const char*>(mine), bytes, compare);
  if (parentRank_ >= 0) result = passUp(result, bytes, compare);
  handDown(result, bytes, compare);
  return std::move(result.data);
}

// This rank's part joined to its children's: every part of the subtree in
// rank order (an all-gather), or their verdict (a comparison); or the
// first failure among them. Every child's message is read, failure or not,
// so that none is left unread when the connections close.
Bootstrap::Outcome Bootstrap::gatherSubtree(const char* mine, size_t bytes, bool compare) {
  Outcome subtree{0, compare ? verdictOf(mine, bytes) : std::vector<char>(mine, mine + bytes)};
  for (Child& child : children_) {
    const Subtree& below = child.subtree;
    const std::string who = "rank " + std::to_string(below.rank) +
                            (below.end - below.rank == 1 ? "" : " (or one of ranks " + std::to_string(below.rank + 1) +
                                                                    ".." + std::to_string(below.end - 1) +
                                                                    " below it in the bootstrap's tree)");
    wire::Message header{};
    std::vector<char> data;
    Outcome heard{0, {}};
    try {
      if (!wire::receiveMessage(child.socket, header, data, deadline_))
        heard = Outcome::failed(ncclRemoteError, who + " left the communicator set-up while others were still in it "
                                         "(a rank failed or exited)");
    } catch (const Error& error) {
      heard = Outcome::failed(error.code(), who + " did not take part in a set-up exchange: " + error.what());
    }
    if (heard.status == 0 && header.status != 0) heard = {header.status, data};
    if (heard.status == 0 && (header.compare != compare || header.partBytes != bytes || !sizedRight(data, bytes, compare, child.subtree)))
      heard = Outcome::failed(ncclInternalError, "ranks sent set-up exchanges of different kinds or sizes");
    if (subtree.status != 0) continue;
    if (heard.status != 0)
      subtree = heard;
    else if (compare)
      joinVerdicts(subtree.data, data, child.subtree.rank, bytes);
    else
      subtree.data.insert(subtree.data.end(), data.begin(), data.end());
  }
  return subtree;
}

// Sends the subtree's outcome to the parent; its answer is the exchange's.
Bootstrap::Outcome Bootstrap::passUp(const Outcome& subtree, size_t bytes, bool compare) {
  try {
    const Deadline by = subtree.status == 0 ? deadline_ : Clock::now() + kTimeToTell;
    wire::sendMessage(parent_, {subtree.status, compare, bytes, subtree.data.size()}, subtree.data.data(), by);
  } catch (const Error&) {
    // The parent is gone; reading from it says so.
  }
  return fromParent(bytes, compare);
}

Bootstrap::Outcome Bootstrap::fromParent(size_t bytes, bool compare) {
  const std::string parent = "rank " + std::to_string(parentRank_) + " (this rank's parent in the bootstrap's tree)";
  wire::Message header{};
  Outcome answer{0, {}};
  try {
    if (!wire::receiveMessage(parent_, header, answer.data, deadline_))
      return Outcome::failed(ncclRemoteError, parent + " left the communicator set-up while others were still in it "
                                        "(a rank failed or exited)");
  } catch (const Error& error) {
    return Outcome::failed(error.code(), parent + " did not answer a set-up exchange: " + error.what());
  }
  if (header.status != 0) return {header.status, std::move(answer.data)};
  if (header.compare != compare || header.partBytes != bytes)
    return Outcome::failed(ncclInternalError, "ranks sent set-up exchanges of different kinds or sizes");
  return answer;
}

// Passes the exchange's result (or its failure) to every child, then
// fails with that failure.
void Bootstrap::handDown(const Outcome& result, size_t bytes, bool compare) {
  const Deadline by = result.status == 0 ? deadline_ : Clock::now() + kTimeToTell;
  for (Child& child : children_) {
    try {
      wire::sendMessage(child.socket, {result.status, compare, bytes, result.data.size()}, result.data.data(), by);
    } catch (const Error&) {
      // That child is gone; its own children learn it from their reads.
    }
  }
  if (result.status != 0)
    fail(static_cast<ncclResult_t>(result.status), std::string(result.data.begin(), result.data.end()));
}

void Bootstrap::close() {
  parent_.close();
  children_.clear();
}

std::vector<char> Bootstrap::allGather(const void* mine, size_t bytes) {
  std::vector<char> all = exchange(mine, bytes, false);
  if (all.size() != bytes * ranks_.size())
    fail(ncclInternalError, "bootstrap all-gather returned the wrong size");
  return all;
}

Bootstrap::Difference Bootstrap::firstDifference(const void* mine, size_t bytes) {
  std::vector<char> reply = exchange(mine, bytes, true);
  if (reply.size() < sizeof(Verdict)) fail(ncclInternalError, "bootstrap comparison returned too little");
  const int32_t differing = differingIn(reply);
  const size_t expected = sizeof(Verdict) + bytes * (differing >= 0 ? 2 : 1);
  if (reply.size() != expected) fail(ncclInternalError, "bootstrap comparison returned the wrong size");
  const char* parts = reply.data() + sizeof(Verdict);
  Difference difference{differing, std::vector<char>(parts, parts + bytes), {}};
  if (differing >= 0) difference.theirs.assign(parts + bytes, parts + 2 * bytes);
  return difference;
}

// Rank 0's message where it failed, else the first failing rank's: the
// lowest failing rank's, as every rank's message differs from an empty one.
void Bootstrap::agreeOnSuccess(bool ok, const std::string& failure) {
  char message[512] = {};
  if (!ok) snprintf(message, sizeof(message), "rank %d: %s", rank_, failure.c_str());
  const Difference difference = firstDifference(message, sizeof(message));
  const std::vector<char>& failed = difference.rankZeros[0] != '\0' ? difference.rankZeros : difference.theirs;
  if (!failed.empty() && failed[0] != '\0')
    fail(ok ? ncclRemoteError : ncclSystemError, std::string(failed.data(), strnlen(failed.data(), failed.size())));
}

void Bootstrap::requireSameSettings(const std::vector<std::pair<std::string, std::string>>& settings) {
  constexpr size_t kValueBytes = 128;
  std::vector<char> mine(settings.size() * kValueBytes);
  for (size_t i = 0; i < settings.size(); ++i)
    snprintf(mine.data() + i * kValueBytes, kValueBytes, "%s", settings[i].second.c_str());
  const Difference difference = firstDifference(mine.data(), mine.size());
  if (difference.rank < 0) return;
  for (size_t i = 0; i < settings.size(); ++i) {
    auto valueIn = [&](const std::vector<char>& values) {
      const char* text = values.data() + i * kValueBytes;
      return std::string(text, strnlen(text, kValueBytes));
    };
    if (valueIn(difference.rankZeros) != valueIn(difference.theirs))
      fail(ncclInvalidUsage, settings[i].first + " is '" + valueIn(difference.rankZeros) + "' on rank 0 and '" +
                                 valueIn(difference.theirs) + "' on rank " + std::to_string(difference.rank) +
                                 ": set it alike on every rank");
  }
}

}  // namespace mojoccl
