#include "base/bootstrap.h"

#include <netinet/in.h>
#include <string.h>
#include <sys/random.h>
#include <sched.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <memory>
#include <thread>

#include "base/error.h"
#include "base/seal.h"
#include "base/settings.h"

namespace mojoccl {
namespace {

constexpr uint64_t kMagic = 0x4c43434f4a4f4d31ull;  // "MOJOCCL1"

// What a unique id holds. It fits in NCCL's 128 bytes.
struct IdContents {
  uint64_t magic;
  uint64_t secret;
  uint32_t addressLength;
  char address[sizeof(sockaddr_in6)];
};
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES, "unique id too large");

struct Hello {
  uint64_t magic;
  uint64_t proof;  // SealKeys::hello: the unique id's secret, mixed with the job key
  int32_t nranks;
  RankInfo info;
};

// Every exchange after the table starts with this from each rank: its part
// follows. An all-gather's reply holds every rank's part; a comparison's,
// only the first part that differs from rank 0's (Difference).
struct Request {
  uint64_t bytes;
  uint32_t compare;  // 1: the root compares the parts and answers with a verdict
  uint32_t reserved;
};

// A comparison's verdict: the first rank whose part differs from rank 0's
// (-1 where none does), then rank 0's part and, where one differs, that
// rank's: a few hundred bytes whatever the number of ranks.
struct Verdict {
  int32_t differing;
};

// Every reply from the root starts with this; a non-zero status carries a
// message of `bytes` characters instead of data.
struct Reply {
  int32_t status;
  uint64_t bytes;
};

int64_t bootstrapTimeoutSeconds() {
  return settingInt("MOJOCCL_BOOTSTRAP_TIMEOUT_S");
}

void sendReply(Socket& sock, int32_t status, const void* data, uint64_t bytes, Deadline deadline) {
  Reply reply{status, bytes};
  sock.sendAll(&reply, sizeof(reply), deadline);
  if (bytes > 0) sock.sendAll(data, bytes, deadline);
}

void sendErrorToAll(std::vector<Socket>& peers, const std::string& message) {
  Deadline soon = Clock::now() + std::chrono::seconds(5);
  for (auto& peer : peers) {
    if (!peer.valid()) continue;
    try {
      sendReply(peer, 1, message.data(), message.size(), soon);
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

// The root: gathers every rank's hello, hands out the table, then serves
// all-gathers until every rank disconnects.
class Root {
 public:
  Root(Socket listener, uint64_t proof, int64_t timeoutSeconds)
      : listener_(std::move(listener)), proof_(proof), timeout_(timeoutSeconds) {}

  void run() {
    try {
      if (!gatherHellos()) return;
      listener_.close();
      serveAllGathers();
    } catch (const Error& error) {
      sendErrorToAll(peers_, std::string("bootstrap root: ") + error.what());
    }
  }

 private:
  // Connections that are not our ranks (no hello, not libmojoccl's) are
  // closed; those of another communicator or job key are told why. Neither
  // holds up the ranks' hellos (acceptGreeted reads them side by side).
  bool gatherHellos() {
    Deadline deadline = Clock::now() + std::chrono::seconds(timeout_);
    int nranks = -1;
    int joined = 0;
    bool failed = false;
    auto greeted = [&](Socket& peer, const std::vector<char>& greeting) {
      Hello hello;
      memcpy(&hello, greeting.data(), sizeof(hello));
      if (hello.magic != kMagic) return;  // not libmojoccl: closed
      if (hello.proof != proof_) return turnAway(peer);
      std::string problem = checkHello(hello, nranks);
      if (!problem.empty()) {
        peers_.push_back(std::move(peer));
        sendErrorToAll(peers_, problem);
        failed = true;
        return;
      }
      if (nranks < 0) {
        nranks = hello.nranks;
        peers_.resize(nranks);
        table_.resize(nranks);
      }
      table_[hello.info.rank] = hello.info;
      peers_[hello.info.rank] = std::move(peer);
      ++joined;
    };
    auto everyone = [&] { return failed || (nranks >= 0 && joined == nranks); };
    if (!acceptGreeted(listener_, sizeof(Hello), deadline, everyone, greeted, [](Socket&, const std::string&) {})) {
      reportMissing(nranks);
      return false;
    }
    if (failed) return false;
    Deadline sendBy = Clock::now() + std::chrono::seconds(timeout_);
    for (auto& peer : peers_)
      sendReply(peer, 0, table_.data(), table_.size() * sizeof(RankInfo), sendBy);
    return true;
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
      sendReply(peer, 1, why.data(), why.size(), Clock::now() + std::chrono::seconds(2));
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

  void serveAllGathers() {
    const int nranks = static_cast<int>(peers_.size());
    while (true) {
      Deadline deadline = Clock::now() + std::chrono::seconds(timeout_);
      std::vector<char> gathered;
      Request first{};
      int closed = 0;
      for (int rank = 0; rank < nranks; ++rank) {
        Request request{};
        if (!peers_[rank].recvAll(&request, sizeof(request), deadline)) {
          peers_[rank].close();
          ++closed;
          continue;
        }
        if (rank - closed == 0) first = request;
        if (request.bytes != first.bytes || request.compare != first.compare)
          fail(ncclInternalError, "ranks sent set-up exchanges of different kinds or sizes");
        size_t offset = gathered.size();
        gathered.resize(offset + request.bytes);
        peers_[rank].recvAll(gathered.data() + offset, request.bytes, deadline);
      }
      if (closed == nranks) return;  // set-up finished everywhere
      if (closed > 0)
        fail(ncclRemoteError, std::to_string(closed) +
                                  " rank(s) left the communicator set-up while others were "
                                  "still in it (a rank failed or exited)");
      const std::vector<char> reply = first.compare ? verdictOn(gathered, first.bytes) : std::move(gathered);
      for (auto& peer : peers_) sendReply(peer, 0, reply.data(), reply.size(), deadline);
    }
  }

  // Every rank's part against rank 0's: the verdict (Verdict, rank 0's
  // part, the first differing one's), in place of all n parts.
  static std::vector<char> verdictOn(const std::vector<char>& parts, size_t bytes) {
    const size_t nranks = bytes == 0 ? 0 : parts.size() / bytes;
    Verdict verdict{-1};
    for (size_t rank = 1; rank < nranks && verdict.differing < 0; ++rank)
      if (memcmp(parts.data(), parts.data() + rank * bytes, bytes) != 0) verdict.differing = static_cast<int32_t>(rank);
    std::vector<char> reply(sizeof(verdict));
    memcpy(reply.data(), &verdict, sizeof(verdict));
    reply.insert(reply.end(), parts.begin(), parts.begin() + bytes);
    if (verdict.differing >= 0)
      reply.insert(reply.end(), parts.begin() + verdict.differing * bytes, parts.begin() + (verdict.differing + 1) * bytes);
    return reply;
  }

  Socket listener_;
  uint64_t proof_;
  Rejections rejections_{"the bootstrap root"};
  int64_t timeout_;
  std::vector<Socket> peers_;
  std::vector<RankInfo> table_;
};

uint64_t hashString(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// Reads one reply; throws the root's message when it reports a failure.
std::vector<char> readReply(Socket& sock, Deadline deadline) {
  Reply reply{};
  if (!sock.recvAll(&reply, sizeof(reply), deadline))
    fail(ncclRemoteError, "the bootstrap root closed the connection (the process that "
                          "called ncclGetUniqueId exited or failed)");
  std::vector<char> data(reply.bytes);
  if (reply.bytes > 0) sock.recvAll(data.data(), reply.bytes, deadline);
  if (reply.status != 0) fail(ncclInvalidUsage, std::string(data.begin(), data.end()));
  return data;
}

}  // namespace

ncclUniqueId createUniqueId() {
  SocketAddress address = chooseBootstrapAddress();
  Socket listener = Socket::listenOn(address);
  IdContents contents{};
  contents.magic = kMagic;
  if (getrandom(&contents.secret, sizeof(contents.secret), 0) != sizeof(contents.secret))
    failSystem("getrandom");
  contents.addressLength = address.length;
  memcpy(contents.address, &address.storage, address.length);

  const uint64_t proof = deriveSealKeys(contents.secret).hello;
  auto root = std::make_shared<Root>(std::move(listener), proof, bootstrapTimeoutSeconds());
  std::thread([root] { root->run(); }).detach();

  ncclUniqueId id{};
  memcpy(id.internal, &contents, sizeof(contents));
  return id;
}

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
  IdContents contents{};
  memcpy(&contents, id.internal, sizeof(contents));
  if (contents.magic != kMagic || contents.addressLength == 0 ||
      contents.addressLength > sizeof(contents.address))
    fail(ncclInvalidArgument, "the unique id was not made by libmojoccl's ncclGetUniqueId "
                              "(is every rank loading the same collective library?)");
  SocketAddress root;
  root.length = contents.addressLength;
  memcpy(&root.storage, contents.address, contents.addressLength);

  keys_ = deriveSealKeys(contents.secret);
  socket_ = Socket::connectTo(root, deadline);
  Hello hello{kMagic, keys_.hello, nranks, mine};
  socket_.sendAll(&hello, sizeof(hello), deadline);
  std::vector<char> table = readReply(socket_, deadline);
  if (table.size() != nranks * sizeof(RankInfo))
    fail(ncclInternalError, "bootstrap root sent a rank table of the wrong size");
  ranks_.resize(nranks);
  memcpy(ranks_.data(), table.data(), table.size());
}

std::vector<char> Bootstrap::exchange(const void* mine, size_t bytes, bool compare) {
  ++rounds_;
  if (!compare) bytesGathered_ += bytes;
  Request request{bytes, compare ? 1u : 0u, 0};
  socket_.sendAll(&request, sizeof(request), deadline_);
  socket_.sendAll(mine, bytes, deadline_);
  return readReply(socket_, deadline_);
}

std::vector<char> Bootstrap::allGather(const void* mine, size_t bytes) {
  std::vector<char> all = exchange(mine, bytes, false);
  if (all.size() != bytes * ranks_.size())
    fail(ncclInternalError, "bootstrap all-gather returned the wrong size");
  return all;
}

Bootstrap::Difference Bootstrap::firstDifference(const void* mine, size_t bytes) {
  std::vector<char> reply = exchange(mine, bytes, true);
  Verdict verdict{};
  if (reply.size() < sizeof(verdict)) fail(ncclInternalError, "bootstrap comparison returned too little");
  memcpy(&verdict, reply.data(), sizeof(verdict));
  const size_t expected = sizeof(verdict) + bytes * (verdict.differing >= 0 ? 2 : 1);
  if (reply.size() != expected) fail(ncclInternalError, "bootstrap comparison returned the wrong size");
  const char* parts = reply.data() + sizeof(verdict);
  Difference difference{verdict.differing, std::vector<char>(parts, parts + bytes), {}};
  if (verdict.differing >= 0) difference.theirs.assign(parts + bytes, parts + 2 * bytes);
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
