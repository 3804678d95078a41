#include "transports/fabric_endpoint.h"

#include <cstring>
#include <future>
#include <mutex>
#include <new>
#include <string>

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include "base/error.h"

namespace mojoccl {
namespace {

std::unique_ptr<FabricEndpoint> openFabricEndpoint(const LibFabric& library, const fi_info* entry) {
  auto opened = std::make_unique<FabricEndpoint>(library);
  fi_info* info = opened->info = library.dupinfo(entry);
  auto check = [&](int result, const char* call) {
    if (result != 0)
      fail(ncclSystemError, std::string(call) + " failed: " + library.strerror(-result) +
                                " (libfabric provider " + info->fabric_attr->prov_name + ")");
  };
  check(library.fabric(info->fabric_attr, &opened->fabric, nullptr), "fi_fabric");
  check(fi_domain(opened->fabric, info, &opened->domain, nullptr), "fi_domain");
  fi_cq_attr cqAttributes{};
  cqAttributes.format = FI_CQ_FORMAT_TAGGED;
  cqAttributes.size = info->tx_attr->size + info->rx_attr->size;
  // With a wait object a rank that has polled a while without news sleeps
  // until the provider has some (fi_cq_sread), rather than hold a core.
  cqAttributes.wait_obj = FI_WAIT_UNSPEC;
  if (fi_cq_open(opened->domain, &cqAttributes, &opened->cq, nullptr) != 0) {
    cqAttributes.wait_obj = FI_WAIT_NONE;
    check(fi_cq_open(opened->domain, &cqAttributes, &opened->cq, nullptr), "fi_cq_open");
  }
  opened->canSleep = cqAttributes.wait_obj != FI_WAIT_NONE;
  fi_av_attr avAttributes{};
  avAttributes.type = FI_AV_TABLE;
  check(fi_av_open(opened->domain, &avAttributes, &opened->av, nullptr), "fi_av_open");
  check(fi_endpoint(opened->domain, info, &opened->endpoint, nullptr), "fi_endpoint");
  check(fi_ep_bind(opened->endpoint, &opened->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind (completion queue)");
  check(fi_ep_bind(opened->endpoint, &opened->av->fid, 0), "fi_ep_bind (address vector)");
  check(fi_enable(opened->endpoint), "fi_enable");
  return opened;
}

// The spare being opened, and for what. Waited for at exit, so that no
// thread is inside libfabric while the process unloads it.
struct Spare {
  std::string provider, domain;
  std::future<std::unique_ptr<FabricEndpoint>> opening;
};

struct Spares {
  std::mutex mutex;
  std::unique_ptr<Spare> next;
  bool replacing = false;  // this process has released an endpoint
  ~Spares() {
    if (next && next->opening.valid()) next->opening.wait();
  }
};

Spares& spares() {
  static Spares instance;
  return instance;
}

// A child of fork() has no thread opening a spare, nor libfabric state it
// could use: it forgets the parent's spare, left unclosed (its future
// would wait at exit for a thread that is not there), and the lock, which
// a thread of the parent may have held.
void forgetSpareInChild() {
  Spares& all = spares();
  (void)all.next.release();
  all.replacing = false;
  new (&all.mutex) std::mutex();
}

bool sameDomain(const Spare& spare, const fi_info* info) {
  return spare.provider == info->fabric_attr->prov_name && spare.domain == info->domain_attr->name;
}

}  // namespace

FabricEndpoint::~FabricEndpoint() {
  if (endpoint) fi_close(&endpoint->fid);
  if (av) fi_close(&av->fid);
  if (cq) fi_close(&cq->fid);
  if (domain) fi_close(&domain->fid);
  if (fabric) fi_close(&fabric->fid);
  if (info) library_.freeinfo(info);
}

std::unique_ptr<FabricEndpoint> takeFabricEndpoint(const LibFabric& library, const fi_info* info) {
  Spares& all = spares();
  std::unique_lock<std::mutex> lock(all.mutex);
  std::unique_ptr<FabricEndpoint> taken;
  if (all.next && sameDomain(*all.next, info)) {
    try {
      taken = all.next->opening.get();
      taken->spare = true;
    } catch (const Error&) {  // opened again below, where its failure is reported
    }
  }
  all.next.reset();
  if (all.replacing) {
    static const int registered = pthread_atfork(nullptr, nullptr, forgetSpareInChild);
    (void)registered;
    all.next = std::make_unique<Spare>(Spare{info->fabric_attr->prov_name, info->domain_attr->name, {}});
    all.next->opening = std::async(std::launch::async, [&library, copy = library.dupinfo(info)] {
      // Idle priority: the communicator taking this endpoint is being set up
      // on the same cores, and the next is wanted only at the next quorum.
      setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
      std::unique_ptr<fi_info, void (*)(fi_info*)> owned(copy, library.freeinfo);
      return openFabricEndpoint(library, owned.get());
    });
  }
  lock.unlock();
  return taken ? std::move(taken) : openFabricEndpoint(library, info);
}

void fabricEndpointReleased() {
  Spares& all = spares();
  std::lock_guard<std::mutex> lock(all.mutex);
  all.replacing = true;
}

}  // namespace mojoccl
