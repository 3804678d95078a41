// Collectives on buffers that every rank can map (ncclMemAlloc memory):
// ranks read each other's buffers in place, with no staging copy. Pure data
// movement (broadcast, all-gather) also reads peers' private buffers, with
// one kernel copy (process_vm_readv), where the system allows it.
//
// Each begins with one step in which ranks share where their buffers are.
// If a buffer the algorithm must read is private on some rank, every rank
// sees it and the function returns false, having moved nothing; the caller
// then runs the staged algorithm. Each ends with finishTogether(): no rank
// returns while a peer may still read its buffers.
#pragma once

#include <cstdint>

#include "algorithms/call.h"
#include "transports/shm.h"

namespace mojoccl {

// Messages from this size on try the zero-copy algorithms first.
constexpr size_t kZeroCopyMinBytes = 16 << 10;

bool allReduceZeroCopy(ShmTransport& shm, uint32_t& rounds, const Call& call);
bool reduceZeroCopy(ShmTransport& shm, uint32_t& rounds, const Call& call);
bool broadcastZeroCopy(ShmTransport& shm, uint32_t& rounds, const Call& call);
bool allGatherZeroCopy(ShmTransport& shm, uint32_t& rounds, const Call& call);
bool reduceScatterZeroCopy(ShmTransport& shm, uint32_t& rounds, const Call& call);

}  // namespace mojoccl
