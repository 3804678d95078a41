// The fabric transport's registered memory: the staging region its
// messages are copied through, and ncclMemAlloc regions, registered with
// the provider on their first message and forgotten when they are freed.
#include <algorithm>
#include <cstdio>
#include <memory>

#include <sys/mman.h>

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include "base/error.h"
#include "base/settings.h"
#include "transports/fabric.h"
#include "transports/fabric_choice.h"
#include "transports/shared_regions.h"

namespace mojoccl {

// MOJOCCL_REGION_MB of memory in 16 slots (at most kMaxPiece each), the
// first half for receives: laid out now, mapped and registered when the
// first message needs it, since registration pins the memory and many
// ranks of a communicator never send or receive between nodes.
void FabricTransport::openStaging() {
  auto region = std::make_unique<StagingRegion>();
  region->bytes = static_cast<size_t>(stagingMegabytes()) << 20;
  region->slotBytes = std::min(region->bytes / 16, kMaxPiece);
  for (int slot = 15; slot >= 0; --slot) region->freeSlots[slot >= 8].push_back(slot);
  staging_ = std::move(region);
}

void FabricTransport::registerStaging() {
  if (staging_->base == nullptr) {
    void* base = mmap(nullptr, staging_->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
      failSystem("mmap of the " + std::to_string(staging_->bytes >> 20) + " MiB staging region (MOJOCCL_REGION_MB)");
    staging_->base = static_cast<char*>(base);  // unmapped by the destructor from here on
  }
  int result = registerMemory(staging_->base, staging_->bytes, &staging_->registration);
  if (result != 0)
    fail(ncclSystemError, "registering the " + std::to_string(staging_->bytes >> 20) +
                              " MiB staging region (MOJOCCL_REGION_MB) with libfabric provider " +
                              info_->fabric_attr->prov_name + " failed: " + library_.strerror(-result) +
                              " (a smaller MOJOCCL_REGION_MB, or a higher locked-memory limit: ulimit -l)");
  staging_->descriptor = fi_mr_desc(staging_->registration);
  if (traceRegistrations_)
    fprintf(stderr, "[mojoccl] rank %d: registered the %zu-byte staging region with %s\n", rank_, staging_->bytes,
            info_->fabric_attr->prov_name);
}

// fi_mr_reg, bound to the endpoint where the provider asks for it; on
// failure `*mr` stays null and the libfabric error is returned.
int FabricTransport::registerMemory(const void* base, size_t bytes, fid_mr** mr) {
  fid_mr* registration = nullptr;
  int result = fi_mr_reg(domain_, base, bytes, FI_SEND | FI_RECV, 0, nextKey_++, 0, &registration, nullptr);
  if (result == 0 && (info_->domain_attr->mr_mode & FI_MR_ENDPOINT)) {
    result = fi_mr_bind(registration, &endpoint_->fid, 0);
    if (result == 0) result = fi_mr_enable(registration);
    if (result != 0) fi_close(&registration->fid);
  }
  *mr = result == 0 ? registration : nullptr;
  return result;
}

void* FabricTransport::descriptorFor(const void* data, size_t bytes) {
  RegionDescriptor region = describeBuffer(data, bytes);
  if (!region.shared()) return nullptr;
  auto found = registrations_.find(region.id);
  if (found == registrations_.end()) {
    const char* base = static_cast<const char*>(data) - region.offset;
    fid_mr* mr = nullptr;
    int result = registerMemory(base, region.regionBytes, &mr);
    // A provider that cannot register it moves it unregistered, as any memory.
    if (traceRegistrations_)
      fprintf(stderr, "[mojoccl] rank %d: %s a %zu-byte ncclMemAlloc region with %s%s\n", rank_,
              mr ? "registered" : "could not register", static_cast<size_t>(region.regionBytes),
              info_->fabric_attr->prov_name, mr ? "" : (std::string(": ") + library_.strerror(-result)).c_str());
    found = registrations_.emplace(region.id, mr).first;
  }
  return found->second ? fi_mr_desc(found->second) : nullptr;
}

void FabricTransport::forgetRegion(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = registrations_.find(id);
  if (found == registrations_.end()) return;
  if (found->second) fi_close(&found->second->fid);
  registrations_.erase(found);
  if (traceRegistrations_) fprintf(stderr, "[mojoccl] rank %d: a registered ncclMemAlloc region was freed\n", rank_);
}

}  // namespace mojoccl
