// The all-to-all among the ranks of one node, as one collective in the
// node's steps rather than a send and a receive per pair.
//
// Each rank decides alone how the others get its parts: a rank whose sends
// are large and readable in place (its buffer in the registered pool, or
// any buffer where process_vm_readv is allowed) leaves them where they are
// and every receiver copies its part straight out (one copy, as Open MPI's
// single-copy path); any other rank copies its parts into its staging slot,
// a piece of each per step, and every receiver copies its piece out. The
// first step carries every rank's counts, so all ranks agree on how many
// steps the largest staged part takes, and a part of another count than its
// receiver expects is skipped and named by that receiver alone (the other
// ranks' calls succeed), as with sends and receives.
#pragma once

#include <cstdint>
#include <vector>

#include "algorithms/call.h"
#include "algorithms/p2p.h"
#include "transports/shm.h"

namespace mojoccl {

// `transfers`: this rank's send to and receive from every rank of the node
// (peer: the local index), as ncclAllToAllv makes them; `call`: the
// all-to-all the ranks compare. `zeroCopy` (MOJOCCL_ZERO_COPY) allows the
// reads in place. Throws MismatchError for a part of another count.
void allToAllWithinNode(ShmTransport& shm, uint32_t& rounds, const Call& call,
                        const std::vector<Transfer>& transfers, bool zeroCopy);

}  // namespace mojoccl
