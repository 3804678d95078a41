// Direct algorithms for the ranks of one node: every rank reads its peers'
// staging slots in shared memory. Messages larger than a slot are cut into
// chunks, one round each, alternating between the two slots so that a rank
// can fill the next chunk while slower peers still read the previous one.
#pragma once

#include <cstdint>

#include "algorithms/call.h"
#include "transports/shm.h"

namespace mojoccl {

// One-shot: every rank reduces all ranks' data. Fewest steps; each rank
// reads nranks times the message.
void allReduceOneShot(ShmTransport& shm, uint32_t& rounds, const Call& call);
// Two-shot: each rank reduces one slice (reduce-scatter), then every rank
// copies all slices (all-gather). Each rank reads about twice the message,
// whatever the number of ranks.
void allReduceTwoShot(ShmTransport& shm, uint32_t& rounds, const Call& call);

// Every rank shares its chunk; the root reduces them all.
void reduceDirect(ShmTransport& shm, uint32_t& rounds, const Call& call);
void broadcastDirect(ShmTransport& shm, uint32_t& rounds, const Call& call);
void allGatherDirect(ShmTransport& shm, uint32_t& rounds, const Call& call);
void reduceScatterDirect(ShmTransport& shm, uint32_t& rounds, const Call& call);

}  // namespace mojoccl
