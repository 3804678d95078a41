#include "algorithms/step.h"

#include <cstring>
#include <string>

#include "base/error.h"

namespace mojoccl {

static_assert(sizeof(CallSignature) + sizeof(CallBuffers) <= kNoteBytes,
              "a call signature and its buffers must fit in a note");

Step::Step(ShmTransport& shm, uint32_t& roundCounter, const Call& call)
    : shm_(shm), call_(call), round_(++roundCounter) {
  // The slot of round r was last used by round r - 2.
  shm_.awaitAll(Stage::Done, round_ - 2);
}

Step::~Step() { shm_.publish(Stage::Done, round_); }

void Step::share(const CallBuffers* buffers) {
  publishAndAwait(buffers);
  checkAgreement();
}

void Step::publishAndAwait(const CallBuffers* buffers) {
  CallSignature signature = CallSignature::of(call_);
  char* note = shm_.note(shm_.self(), round_);
  std::memcpy(note, &signature, sizeof(signature));
  CallBuffers none{};
  std::memcpy(note + sizeof(signature), buffers != nullptr ? buffers : &none, sizeof(CallBuffers));
  shm_.publish(Stage::Posted, round_);
  shm_.awaitAll(Stage::Posted, round_);
}

CallBuffers Step::buffersOf(int peer) const {
  CallBuffers buffers{};
  std::memcpy(&buffers, shm_.note(peer, round_) + sizeof(CallSignature), sizeof(buffers));
  return buffers;
}

void Step::finishTogether() {
  shm_.publish(Stage::Done, round_);
  shm_.awaitAll(Stage::Done, round_);
}

void Step::shareCopyOf(const void* data, size_t bytes) {
  std::memcpy(mine(), data, bytes);
  share();
}

void Step::checkAgreement() const {
  std::string problem = disagreement();
  if (!problem.empty()) throw MismatchError(problem);
}

std::string Step::disagreement() const {
  // Every rank compares every signature with the lowest rank's, so all of
  // them find the same disagreement and report it in the same words.
  CallSignature first{};
  std::memcpy(&first, shm_.note(0, round_), sizeof(first));
  for (int peer = 1; peer < shm_.size(); ++peer) {
    CallSignature other{};
    std::memcpy(&other, shm_.note(peer, round_), sizeof(other));
    if (!other.sameCollective(first))
      return mismatchText(shm_.commRank(peer), other, shm_.commRank(0), first);
  }
  return "";
}

std::string mismatchText(int rank, const CallSignature& called, int firstRank, const CallSignature& first) {
  std::string where = called.sequence == first.sequence
                          ? "call #" + std::to_string(first.sequence)
                          : "calls #" + std::to_string(called.sequence) + " and #" +
                                std::to_string(first.sequence);
  return "collective mismatch at " + where + ": rank " + std::to_string(rank) + " called " +
         called.describe() + ", rank " + std::to_string(firstRank) + " called " + first.describe() +
         "; every rank must issue the same collectives in the same order";
}

}  // namespace mojoccl
