// What keeps a communicator sealed: the keys its ranks prove they belong
// with, derived from the unique id's random secret and, where a site sets
// one, a job key the launcher gives every rank (MOJOCCL_JOB_KEY, or
// MOJOCCL_JOB_KEY_FILE). The unique id travels through the c10d store,
// which anyone who reaches its port can read; the job key does not, so a
// process that read the store still cannot join. docs/security.md has the
// model: what is kept out, what is not, and what each rejection logs.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace mojoccl {

struct SealKeys {
  uint64_t hello = 0;      // what a rank presents to the bootstrap root
  uint64_t peerWatch = 0;  // what a node leader presents to another
  uint64_t fabric = 0;     // what every message between nodes carries
};

// The keys of the communicator whose unique id holds `secret`, mixed with
// this process's job key. Ranks with another job key get other keys.
SealKeys deriveSealKeys(uint64_t secret);

// MOJOCCL_JOB_KEY, else the contents of MOJOCCL_JOB_KEY_FILE (which must
// be readable by its owner alone), else "". A bad setting is an
// ncclInvalidArgument that says what to do.
std::string jobKey();

// SipHash-2-4 of `bytes` under the 128-bit key (k0, k1): a keyed hash that
// reveals nothing of the key.
uint64_t sipHash(uint64_t k0, uint64_t k1, const void* bytes, size_t length);

// Counts what was turned away, and says so on stderr the first time:
// "[mojoccl] WARNING: <where> turned away <what> (docs/security.md)".
class Rejections {
 public:
  explicit Rejections(std::string where) : where_(std::move(where)) {}
  void record(const std::string& what);
  uint64_t count() const { return count_.load(); }

 private:
  std::string where_;
  std::atomic<uint64_t> count_{0};
};

}  // namespace mojoccl
