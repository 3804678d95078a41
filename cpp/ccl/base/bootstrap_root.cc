// The bootstrap's root: a thread of the process that called
// ncclGetUniqueId. It gathers every rank's hello, answers rank 0 with the
// table of ranks and every other rank with where its parent in the tree
// listens, and exits: the ranks' exchanges then run over the tree
// (bootstrap.cc), so that the root's work is one hello and one answer a rank.
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>

#include <memory>
#include <thread>

#include "base/bootstrap.h"
#include "base/bootstrap_wire.h"
#include "base/error.h"
#include "base/seal.h"
#include "base/settings.h"

namespace mojoccl {
namespace {

using wire::Hello;

void sendErrorToAll(std::vector<Socket>& peers, const std::string& message) {
  Deadline soon = Clock::now() + std::chrono::seconds(5);
  for (auto& peer : peers) {
    if (!peer.valid()) continue;
    try {
      wire::sendFailure(peer, ncclInvalidUsage, message, soon);
    } catch (const Error&) {
      // That rank is gone already; the others still get the message.
    }
  }
}

std::string rankList(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return text;
}

// The root holds a connection per rank until every rank has joined: past
// the soft limit on open files it raises it to the hard one, and where
// that is too few says what to change.
std::string makeRoomForConnections(int nranks) {
  constexpr rlim_t kSpare = 64;  // the process's own files and sockets
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return "";
  const rlim_t needed = static_cast<rlim_t>(nranks) + kSpare;
  if (limit.rlim_cur >= needed) return "";
  if (limit.rlim_max >= needed) {
    limit.rlim_cur = needed;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) return "";
  }
  return "the bootstrap root holds a connection per rank: " + std::to_string(nranks) +
         " ranks need about " + std::to_string(needed) + " open files, and rank 0's process may open " +
         std::to_string(limit.rlim_max) + " (raise `ulimit -n` where rank 0 runs)";
}

class Root {
 public:
  Root(Socket listener, uint64_t proof, int64_t timeoutSeconds)
      : listener_(std::move(listener)), proof_(proof), timeout_(timeoutSeconds) {}

  void run() {
    try {
      if (!gatherHellos()) return;
      listener_.close();
      answer();
    } catch (const Error& error) {
      sendErrorToAll(peers_, std::string("bootstrap root: ") + error.what());
    }
  }

 private:
  // Connections that are not our ranks (no hello, not libmojoccl's) are
  // closed; those of another communicator or job key are told why. Neither
  // holds up the ranks' hellos (acceptGreeted reads them side by side).
  // Once a hello shows a problem, every rank that has joined is told, and
  // every rank still to come is told as it arrives.
  bool gatherHellos() {
    Deadline deadline = Clock::now() + std::chrono::seconds(timeout_);
    int nranks = -1;
    int joined = 0;
    auto greeted = [&](Socket& peer, const std::vector<char>& greeting) {
      Hello hello;
      memcpy(&hello, greeting.data(), sizeof(hello));
      if (hello.magic != wire::kMagic) return;  // not libmojoccl: closed
      if (hello.proof != proof_) return turnAway(peer);
      if (problem_.empty()) problem_ = checkHello(hello, nranks);
      if (problem_.empty() && nranks < 0) problem_ = makeRoomForConnections(hello.nranks);
      if (nranks < 0) {
        nranks = hello.nranks;
        peers_.resize(std::max(nranks, 0));
        hellos_.resize(std::max(nranks, 0));
      }
      ++joined;
      if (!problem_.empty()) {
        peers_.push_back(std::move(peer));
        sendErrorToAll(peers_, problem_);
        for (auto& told : peers_) told.close();
        return;
      }
      hellos_[hello.info.rank] = hello;
      peers_[hello.info.rank] = std::move(peer);
    };
    auto everyone = [&] { return nranks >= 0 && joined >= nranks; };
    const bool allCame = acceptGreeted(listener_, sizeof(Hello), deadline, everyone, greeted,
                                       [](Socket&, const std::string&) {});
    if (!problem_.empty()) return false;
    if (!allCame) reportMissing(nranks);
    return allCame;
  }

  // Rank 0 gets the table of ranks (it hands it down the tree), every
  // other rank its parent's address; then the root's part is done.
  void answer() {
    const int nranks = static_cast<int>(peers_.size());
    Deadline sendBy = Clock::now() + std::chrono::seconds(timeout_);
    std::vector<RankInfo> table;
    for (const Hello& hello : hellos_) table.push_back(hello.info);
    wire::sendMessage(peers_[0], {0, 0, sizeof(RankInfo), table.size() * sizeof(RankInfo)}, table.data(), sendBy);
    for (int rank = 1; rank < nranks; ++rank) {
      const wire::PackedAddress& parent = hellos_[wire::treeLinks(rank, nranks).parent].listening;
      if (!parent.valid())
        fail(ncclInternalError, "a rank with children in the bootstrap's tree sent no address to reach it");
      wire::sendMessage(peers_[rank], {0, 0, sizeof(parent), sizeof(parent)}, &parent, sendBy);
    }
    for (auto& peer : peers_) peer.close();
  }

  std::string checkHello(const Hello& hello, int nranks) {
    const int rank = hello.info.rank;
    if (nranks >= 0 && hello.nranks != nranks)
      return "rank " + std::to_string(rank) + " was started for " +
             std::to_string(hello.nranks) + " ranks, others for " + std::to_string(nranks) +
             ": every rank must pass the same nranks";
    int size = nranks >= 0 ? nranks : hello.nranks;
    if (rank < 0 || rank >= size) return "rank " + std::to_string(rank) + " is out of range";
    if (nranks >= 0 && peers_[rank].valid())
      return "two processes both joined as rank " + std::to_string(rank) +
             ": every rank must pass a different rank";
    return "";
  }

  // A rank of another communicator, or of this one started with another
  // job key: it learns why at once; the communicator goes on gathering.
  void turnAway(Socket& peer) {
    rejections_.record("a process at " + peer.peerName() +
                       " whose unique id or MOJOCCL_JOB_KEY is not this communicator's");
    try {
      const std::string why =
          "the bootstrap root turned this process away: its unique id or MOJOCCL_JOB_KEY is not the "
          "communicator's (another job's id from the store, or a job key that differs from rank 0's; "
          "docs/security.md)";
      wire::sendFailure(peer, ncclInvalidUsage, why, Clock::now() + std::chrono::seconds(2));
    } catch (const Error&) {
      // It left already.
    }
  }

  std::string turnedAwayNote() const {
    const uint64_t count = rejections_.count();
    if (count == 0) return "";
    return " (" + std::to_string(count) + " process(es) presenting another unique id or MOJOCCL_JOB_KEY were "
           "turned away: is MOJOCCL_JOB_KEY the same on every rank?)";
  }

  void reportMissing(int nranks) {
    std::vector<int> missing;
    for (int rank = 0; rank < nranks; ++rank)
      if (!peers_[rank].valid()) missing.push_back(rank);
    std::string who = nranks < 0 ? "no rank" : "rank(s) " + rankList(missing) + " of " +
                                                   std::to_string(nranks);
    sendErrorToAll(peers_, who + " did not join the communicator within " +
                               std::to_string(timeout_) +
                               " s (MOJOCCL_BOOTSTRAP_TIMEOUT_S); check that every rank "
                               "reaches ncclCommInitRank with the same unique id" + turnedAwayNote());
  }

  Socket listener_;
  uint64_t proof_;
  Rejections rejections_{"the bootstrap root"};
  int64_t timeout_;
  std::vector<Socket> peers_;
  std::vector<Hello> hellos_;
  std::string problem_;  // why the communicator cannot be made, once a hello shows it
};

}  // namespace

ncclUniqueId createUniqueId() {
  SocketAddress address = chooseBootstrapAddress();
  Socket listener = Socket::listenOn(address);
  wire::IdContents contents{};
  contents.magic = wire::kMagic;
  if (getrandom(&contents.secret, sizeof(contents.secret), 0) != sizeof(contents.secret))
    failSystem("getrandom");
  contents.root = wire::PackedAddress::of(address);

  const uint64_t proof = deriveSealKeys(contents.secret).hello;
  auto root = std::make_shared<Root>(std::move(listener), proof, settingInt("MOJOCCL_BOOTSTRAP_TIMEOUT_S"));
  std::thread([root] { root->run(); }).detach();

  ncclUniqueId id{};
  memcpy(id.internal, &contents, sizeof(contents));
  return id;
}

}  // namespace mojoccl
