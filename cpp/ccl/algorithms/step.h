// One step ("round") of a direct algorithm over the shared-memory transport.
//
// A step claims the next round, whose slot is free once every rank has
// finished the round that used it before. share() publishes this rank's
// slot together with its call signature and returns when every peer has
// done the same for the same call; a mismatch throws on every rank alike.
// The destructor publishes Done, which frees the slot for reuse.
#pragma once

#include <cstdint>
#include <string>

#include "algorithms/call.h"
#include "transports/shm.h"

namespace mojoccl {

class Step {
 public:
  Step(ShmTransport& shm, uint32_t& roundCounter, const Call& call);
  ~Step();
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  char* mine() const { return shm_.slot(shm_.self(), round_); }
  const char* of(int peer) const { return shm_.slot(peer, round_); }

  // `buffers`, when given, travel with the call signature (zero-copy.cc).
  void share(const CallBuffers* buffers = nullptr);
  // Copies `bytes` of `data` into this rank's slot, then share().
  void shareCopyOf(const void* data, size_t bytes);
  CallBuffers buffersOf(int peer) const;
  // Publishes Done and waits for every rank's: peers have stopped reading
  // this rank's buffers, so the caller may change them.
  void finishTogether();
  // share() without the check: the caller asks disagreement() (to pass a
  // mismatch on before raising it).
  void publishAndAwait(const CallBuffers* buffers = nullptr);
  // Empty when every rank shares the same call, else the words every rank
  // uses to report the difference.
  std::string disagreement() const;
  void publishReduced() { shm_.publish(Stage::Reduced, round_); }
  void awaitReduced() const { shm_.awaitAll(Stage::Reduced, round_); }

 private:
  void checkAgreement() const;

  ShmTransport& shm_;
  const Call& call_;
  uint32_t round_;
};

// "collective mismatch at call #N: rank R called ..., rank F called ...; ..."
std::string mismatchText(int rank, const CallSignature& called, int firstRank, const CallSignature& first);

}  // namespace mojoccl
