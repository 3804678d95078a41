// One rank's libfabric objects for a communicator: the fabric, domain,
// completion queue, address vector and enabled endpoint FabricTransport
// sends and receives on.
//
// Opening them is most of a communicator's set-up between nodes (ofi_rxm
// over tcp spends 40-50 ms in fi_enable, filling its buffer pools). A
// process that replaces its communicators, as torchft rebuilds its group at
// every quorum change, would pay that each time: once a process has
// released an endpoint, each one it takes has the next opened in the
// background (a spare, for the same provider and domain), which the next
// communicator takes at once. A spare is new, never used by another
// communicator: nothing of an old one can reach it. Processes that never
// replace a communicator open no spare.
#pragma once

#include <memory>

#include <rdma/fabric.h>

#include "transports/libfabric.h"

namespace mojoccl {

struct FabricEndpoint {
  fi_info* info = nullptr;  // the copy of the entry they were opened for (theirs)
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  fid_ep* endpoint = nullptr;
  bool canSleep = false;  // the completion queue has a wait object (fi_cq_sread)
  bool spare = false;     // opened in the background, before its communicator

  explicit FabricEndpoint(const LibFabric& library) : library_(library) {}
  ~FabricEndpoint();  // closes what is open, the endpoint first
  FabricEndpoint(const FabricEndpoint&) = delete;
  FabricEndpoint& operator=(const FabricEndpoint&) = delete;

 private:
  const LibFabric& library_;
};

// The endpoint for `info` (an entry of fi_getinfo's answer): the spare
// where one was opened for its provider and domain, else opened now.
// Throws Error, naming the call that failed.
std::unique_ptr<FabricEndpoint> takeFabricEndpoint(const LibFabric& library, const fi_info* info);

// A communicator's transport let its endpoint go: this process replaces
// communicators, and gets spares from now on.
void fabricEndpointReleased();

}  // namespace mojoccl
