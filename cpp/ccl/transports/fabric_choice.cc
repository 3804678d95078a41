#include "transports/fabric_choice.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include <dirent.h>
#include <sched.h>

#include <rdma/fi_domain.h>

#include "base/settings.h"
#include "base/socket.h"

namespace mojoccl {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text.empty() ? "none" : text;
}

// The NUMA node of a domain's NIC, from its PCI address; -1 where the
// provider reports none or the system does not say.
int numaNodeOfNic(const fi_info* info) {
  if (info->nic == nullptr || info->nic->bus_attr == nullptr || info->nic->bus_attr->bus_type != FI_BUS_PCI)
    return -1;
  const auto& pci = info->nic->bus_attr->attr.pci;
  char path[128];
  std::snprintf(path, sizeof(path), "/sys/bus/pci/devices/%04x:%02x:%02x.%x/numa_node", pci.domain_id,
                pci.bus_id, pci.device_id, pci.function_id);
  std::ifstream file(path);
  int node = -1;
  return file >> node ? node : -1;
}

// The NUMA node of the first CPU this process may run on (launchers bind
// a rank near its GPU and NIC); -1 where the system does not say.
int numaNodeOfThisRank() {
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0) return -1;
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &cpus)) ++cpu;
  const std::string directory = "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
  DIR* entries = opendir(directory.c_str());
  if (entries == nullptr) return -1;
  int node = -1;
  while (dirent* entry = readdir(entries))
    if (std::strncmp(entry->d_name, "node", 4) == 0) node = std::atoi(entry->d_name + 4);
  closedir(entries);
  return node;
}

// Among domains whose NICs have PCI addresses, several of them: those on
// this rank's NUMA node (all of them where none is), local rank i taking
// the (i mod n)th. Otherwise the first domain.
fi_info* byLocality(const std::vector<fi_info*>& domains, int localIndex) {
  std::vector<fi_info*> placed, near;
  const int here = numaNodeOfThisRank();
  for (fi_info* info : domains) {
    const int node = numaNodeOfNic(info);
    if (node < 0) continue;
    placed.push_back(info);
    if (node == here) near.push_back(info);
  }
  if (placed.size() < 2) return domains.front();
  const auto& candidates = near.empty() ? placed : near;
  return candidates[localIndex % candidates.size()];
}

// ofi_rxm sends messages up to its eager limit at once and larger ones
// after a rendezvous round trip. Over tcp the limit may exceed its 16 KiB
// buffers at no cost in memory (it receives into the posted buffer), so
// unless the site set it, messages up to 128 KiB go at once: the leaders'
// frames, small collectives' data. Set before libfabric reads it, at the
// process's first fi_getinfo.
constexpr size_t kTcpEagerLimit = 131072;

// The largest message under ofi_rxm's eager `limit`: well under 256 bytes
// of a message are its header.
size_t underEagerLimit(size_t limit) { return limit > 1024 ? limit - 256 : SIZE_MAX; }

// ofi_rxm's variables as libfabric reads them (it checks them itself).
size_t rxmSetting(const char* name, size_t fallback) {
  const char* text = std::getenv(name);
  return text && *text ? std::strtoull(text, nullptr, 10) : fallback;
}


// The fabric NICs the kernel knows, whatever libfabric offers: Slingshot's
// (cxi0) and RDMA devices (InfiniBand's mlx5_0, EFA's efa_0).
std::vector<std::string> fabricNics() {
  std::vector<std::string> names;
  for (const char* directory : {"/sys/class/cxi", "/sys/class/infiniband"}) {
    DIR* entries = opendir(directory);
    if (entries == nullptr) continue;
    while (dirent* entry = readdir(entries))
      if (entry->d_name[0] != '.') names.push_back(entry->d_name);
    closedir(entries);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// fi_getinfo for `provider`'s reliable tagged endpoints, every domain (not
// only the asked ones: utility providers such as ofi_rxm may not filter by
// domain, and an error names those there are); null, with `failure`, where
// it has none.
fi_info* getinfoFor(const LibFabric& library, const std::string& provider, std::string* failure,
                    uint64_t caps = FI_TAGGED | FI_DIRECTED_RECV) {
  fi_info* hints = library.dupinfo(nullptr);
  hints->caps = caps;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                                FI_MR_ENDPOINT;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  fi_info* list = nullptr;
  const int status = library.getinfo(FI_VERSION(1, 10), nullptr, nullptr, 0, hints, &list);
  library.freeinfo(hints);
  if (status == 0 && list != nullptr) return list;
  // Receives that take only the communicator's ranks keep strangers out
  // (fabric.h); a provider without them is still used, every message's key
  // checked.
  if (caps & FI_DIRECTED_RECV) return getinfoFor(library, provider, failure, caps & ~FI_DIRECTED_RECV);
  *failure = library.strerror(-status);
  return nullptr;
}

}  // namespace

size_t eagerBytes(const fi_info* info) {
  // libfabric 1.17's `net` (its own reliable datagrams over TCP) sends
  // every message at once; in pieces as large as ofi_rxm's over tcp its
  // messages moved fastest (pieces of 64 KiB or of 128 KiB took the
  // all-gather of 1 MiB 2.3x and 1.9x as long between 2 nodes).
  if (std::strcmp(info->fabric_attr->prov_name, "net") == 0) return underEagerLimit(kTcpEagerLimit);
  if (std::strstr(info->fabric_attr->prov_name, "ofi_rxm") == nullptr) return SIZE_MAX;
  // The limit is its buffer's size unless set apart.
  return underEagerLimit(rxmSetting("FI_OFI_RXM_EAGER_LIMIT", rxmSetting("FI_OFI_RXM_BUFFER_SIZE", 16384)));
}

bool directedReceives() { return settingOn("MOJOCCL_FABRIC_DIRECTED_RECV"); }

bool forcedLocalRegistration() { return settingOn("MOJOCCL_FABRIC_MR_LOCAL"); }

int64_t stagingMegabytes() { return settingInt("MOJOCCL_REGION_MB"); }

bool registersLocalBuffers(const fi_info* info) {
  return (info->domain_attr->mr_mode & FI_MR_LOCAL) || forcedLocalRegistration();
}

bool wantsTcpEagerLimit() {
  const std::string setting = settingText("MOJOCCL_FABRIC_PROVIDER");
  return setting == "tcp" || (setting == "auto" && fabricNics().empty());
}

FabricChoice chooseFabric(const LibFabric& library, int localIndex, bool raiseTcpEagerLimit) {
  FabricChoice choice;
  const std::string setting = settingText("MOJOCCL_FABRIC_PROVIDER");
  const std::vector<std::string> asked = commaSeparated(settingText("MOJOCCL_FABRIC_DOMAIN"));
  const std::vector<std::string> nics = fabricNics();
  if (raiseTcpEagerLimit) setenv("FI_OFI_RXM_EAGER_LIMIT", std::to_string(kTcpEagerLimit).c_str(), /*overwrite=*/0);

  std::string provider = setting;
  std::string failure;
  if (setting == "auto") {
    for (const std::string& candidate : autoProviders()) {
      provider = candidate;
      choice.list = getinfoFor(library, provider, &failure);
      if (choice.list != nullptr) break;
    }
    choice.how = "MOJOCCL_FABRIC_PROVIDER=auto";
    if (choice.list != nullptr && provider == "tcp" && !nics.empty())
      choice.warning = "fabric NIC" + std::string(nics.size() > 1 ? "s " : " ") + joined(nics) +
                       " present, but libfabric " + library.versionText() + " (" + library.path +
                       ") offers none of cxi, verbs, efa over " + std::string(nics.size() > 1 ? "them" : "it") +
                       ": collectives between nodes go over TCP, many times slower. Load the site's "
                       "libfabric (module load libfabric, or MOJOCCL_LIBFABRIC=<its libfabric.so.1>)";
  } else {
    choice.list = getinfoFor(library, provider, &failure);
    choice.how = "MOJOCCL_FABRIC_PROVIDER=" + setting;
  }
  if (choice.list == nullptr) {
    choice.failure = "libfabric " + library.versionText() + " (" + library.path + ") has no provider " +
                     (setting == "auto" ? "of " + joined(autoProviders()) : "'" + provider + "'") +
                     " offering reliable tagged messages (FI_EP_RDM, FI_TAGGED): " + failure +
                     ". Providers here: " + joined(library.providers()) +
                     ". Set MOJOCCL_FABRIC_PROVIDER to one of them (cxi on Slingshot, verbs on "
                     "InfiniBand, tcp elsewhere)";
    return choice;
  }

  std::vector<fi_info*> domains;  // the first entry of each domain, in the provider's order
  std::vector<std::string> names;
  for (fi_info* info = choice.list; info != nullptr; info = info->next) {
    if (std::find(names.begin(), names.end(), info->domain_attr->name) != names.end()) continue;
    names.push_back(info->domain_attr->name);
    domains.push_back(info);
  }
  auto named = [&](const std::string& name) -> fi_info* {
    auto at = std::find(names.begin(), names.end(), name);
    return at == names.end() ? nullptr : domains[at - names.begin()];
  };
  // Where domains are network interfaces (tcp), MOJOCCL_SOCKET_IFNAME
  // chooses among them, as NCCL_SOCKET_IFNAME does for NCCL's sockets.
  const std::string ifname = settingText("MOJOCCL_SOCKET_IFNAME");
  auto byInterface = std::find_if(names.begin(), names.end(),
                                  [&](const std::string& name) { return !ifname.empty() && matchesIfname(name, ifname); });

  std::vector<std::string> missing;
  for (const auto& name : asked)
    if (!named(name) && std::find(missing.begin(), missing.end(), name) == missing.end()) missing.push_back(name);
  if (!missing.empty()) {
    for (auto& name : missing) name = "'" + name + "'";
    choice.failure = "libfabric provider " + provider + " has no domain" + (missing.size() > 1 ? "s " : " ") +
                     joined(missing) + " (MOJOCCL_FABRIC_DOMAIN" +
                     (asked.size() > 1 ? "=" + settingText("MOJOCCL_FABRIC_DOMAIN") : "") + "); its domains here: " +
                     joined(names);
  } else if (!asked.empty()) {
    choice.info = named(asked[localIndex % asked.size()]);
  } else if (byInterface != names.end()) {
    choice.info = domains[byInterface - names.begin()];
  } else {
    choice.info = byLocality(domains, localIndex);
  }
  if (choice.info && registersLocalBuffers(choice.info) && stagingMegabytes() == 0) {
    choice.failure = std::string(forcedLocalRegistration()
                                     ? "MOJOCCL_FABRIC_MR_LOCAL=1 registers every buffer"
                                     : "libfabric provider " + provider + " needs registered local buffers (FI_MR_LOCAL)") +
                     ", and MOJOCCL_REGION_MB=0 turns off the registered staging buffer that ordinary "
                     "memory goes through: unset MOJOCCL_REGION_MB (256 MiB) or set it to a size in MiB";
  }
  if (!choice.failure.empty()) choice.info = nullptr;
  return choice;
}

std::string describeFabric(const FabricChoice& choice, const LibFabric& library) {
  return std::string(choice.info->fabric_attr->prov_name) + " on " + choice.info->domain_attr->name +
         " (libfabric " + library.versionText() + ", " + library.path + ", " + choice.how + ")";
}

const std::vector<std::string>& autoProviders() {
  // The fabric NICs' providers first, in NCCL's spirit: the fastest network
  // present, sockets last.
  static const std::vector<std::string> providers{"cxi", "verbs", "efa", "tcp"};
  return providers;
}

}  // namespace mojoccl
