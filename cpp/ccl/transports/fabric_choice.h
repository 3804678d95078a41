// Which libfabric provider and domain (NIC) a rank's endpoint opens, from
// MOJOCCL_FABRIC_PROVIDER (by default `auto`: cxi, verbs, efa, then tcp,
// the first libfabric offers), MOJOCCL_FABRIC_DOMAIN and MOJOCCL_SOCKET_IFNAME:
// chosen by one function for the transport and for `torch-mojo doctor`
// (mojocclDescribeFabric).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <rdma/fabric.h>

#include "transports/libfabric.h"

namespace mojoccl {

struct FabricChoice {
  fi_info* list = nullptr;  // fi_getinfo's answer, the caller's to free
  fi_info* info = nullptr;  // the entry of `list` to open; null on failure
  std::string failure;      // why there is none, and what to set
  std::string how;          // "MOJOCCL_FABRIC_PROVIDER=auto", or as set
  std::string warning;      // a fabric NIC present but not used, and what to do
};

// The domain for the rank at `localIndex` among its node's ranks:
// - MOJOCCL_FABRIC_DOMAIN set: one name, or a comma-separated list of which
//   local rank i takes entry i mod n, so that each rank drives its own NIC
//   (every name must be one of the provider's domains);
// - else, with tcp, the interface MOJOCCL_SOCKET_IFNAME matches;
// - else, where the provider reports its NICs' PCI addresses and has several,
//   those on this rank's NUMA node (all where none is), local rank i taking
//   the (i mod n)th;
// - else the provider's first.
//
// `raiseTcpEagerLimit` sets FI_OFI_RXM_EAGER_LIMIT to 128 KiB unless the
// user set it; it works only before the process's first fi_getinfo.
FabricChoice chooseFabric(const LibFabric& library, int localIndex, bool raiseTcpEagerLimit);

// Whether this rank would raise ofi_rxm's eager limit over tcp. ofi_rxm
// reads it once, when libfabric first loads its providers: before `auto`
// knows what it will find. So it is raised where tcp is asked for, or
// where `auto` sees no fabric NIC (/sys/class/cxi, /sys/class/infiniband)
// and tcp is all it can find. The ranks of a job agree on it first
// (every rank's answer must be yes): ranks that cut messages by different
// sizes would not meet.
bool wantsTcpEagerLimit();

// The largest message `info`'s provider sends at once, without a
// rendezvous round trip (for `net`, which sends every message at once, the
// size its messages move fastest in); SIZE_MAX where it does not say.
size_t eagerBytes(const fi_info* info);

// Whether every buffer must be registered: the provider needs it
// (FI_MR_LOCAL, as verbs), or MOJOCCL_FABRIC_MR_LOCAL=1 asks for it, which
// runs that path on providers that do not need it (tcp, in the tests).
bool registersLocalBuffers(const fi_info* info);
bool forcedLocalRegistration();
// Whether receives name their source where the provider can
// (MOJOCCL_FABRIC_DIRECTED_RECV=1, the default); 0 takes the path of
// providers that cannot, every message's key checked (tcp, in the tests).
bool directedReceives();
int64_t stagingMegabytes();  // MOJOCCL_REGION_MB

// The providers MOJOCCL_FABRIC_PROVIDER=auto tries, in order.
const std::vector<std::string>& autoProviders();

// "tcp;ofi_rxm on lo (libfabric 1.17, /usr/lib/.../libfabric.so.1,
// MOJOCCL_FABRIC_PROVIDER=auto)"
std::string describeFabric(const FabricChoice& choice, const LibFabric& library);

}  // namespace mojoccl
