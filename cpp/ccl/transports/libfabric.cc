#include "transports/libfabric.h"

#include <dlfcn.h>
#include <glob.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <mutex>

#include "base/error.h"
#include "base/settings.h"

namespace mojoccl {
namespace {

std::vector<std::string> candidates() {
  std::vector<std::string> paths;
  std::string chosen = settingText("MOJOCCL_LIBFABRIC");
  if (!chosen.empty()) return {chosen};  // the user's choice is not second-guessed
#ifdef MOJOCCL_SITE_LIBFABRIC
  paths.push_back(MOJOCCL_SITE_LIBFABRIC);
#endif
  paths.push_back("libfabric.so.1");
  glob_t found{};
  if (glob("/opt/cray/libfabric/*/lib64/libfabric.so.1", 0, nullptr, &found) == 0)
    for (size_t i = found.gl_pathc; i-- > 0;) paths.push_back(found.gl_pathv[i]);  // newest first
  globfree(&found);
  return paths;
}

template <typename Function>
void lookUp(void* handle, const char* name, Function& function, const std::string& path) {
  function = reinterpret_cast<Function>(dlsym(handle, name));
  if (function == nullptr) fail(ncclSystemError, path + " has no " + name + ": is it libfabric?");
}

LibFabric load() {
  std::string tried;
  for (const auto& path : candidates()) {
    void* handle = nullptr;
    {
      SignalHandlersKept handlers;  // provider libraries it links may install theirs on load
      handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    }
    if (handle == nullptr) {
      tried += "\n  " + path + ": " + dlerror();
      continue;
    }
    LibFabric library;
    char loaded[4096] = {};
    library.path = dlinfo(handle, RTLD_DI_ORIGIN, loaded) == 0 && path.find('/') == std::string::npos
                       ? std::string(loaded) + "/" + path
                       : path;
    uint32_t (*version)() = nullptr;
    lookUp(handle, "fi_version", version, path);
    lookUp(handle, "fi_getinfo", library.getinfo, path);
    lookUp(handle, "fi_freeinfo", library.freeinfo, path);
    lookUp(handle, "fi_dupinfo", library.dupinfo, path);
    lookUp(handle, "fi_fabric", library.fabric, path);
    lookUp(handle, "fi_strerror", library.strerror, path);
    library.version = version();
    return library;  // the handle stays open for the life of the process
  }
  fail(ncclSystemError,
       "libfabric could not be loaded, and it carries collectives between nodes; tried:" + tried +
           "\nInstall libfabric (the site's module, or the distribution's libfabric1 package) "
           "or set MOJOCCL_LIBFABRIC to its libfabric.so.1");
}

}  // namespace

const LibFabric& LibFabric::get() {
  // A failure is remembered and raised again: every communicator learns why.
  static std::once_flag once;
  static std::unique_ptr<LibFabric> library;
  static std::string failure;
  std::call_once(once, [] {
    try {
      library = std::make_unique<LibFabric>(load());
    } catch (const Error& error) {
      failure = error.what();
    }
  });
  if (!library) fail(ncclSystemError, failure);
  return *library;
}

std::vector<std::string> LibFabric::providers() const {
  std::vector<std::string> names;
  fi_info* list = nullptr;
  SignalHandlersKept handlers;
  if (getinfo(FI_VERSION(1, 10), nullptr, nullptr, 0, nullptr, &list) != 0) return names;
  for (fi_info* info = list; info != nullptr; info = info->next) {
    std::string name = info->fabric_attr->prov_name;
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  freeinfo(list);
  return names;
}

SignalHandlersKept::SignalHandlersKept() {
  for (size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], nullptr, &saved_[i]);
}

SignalHandlersKept::~SignalHandlersKept() {
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    struct sigaction now {};
    sigaction(kSignals[i], nullptr, &now);
    if (now.sa_handler != saved_[i].sa_handler) sigaction(kSignals[i], &saved_[i], nullptr);
  }
}

std::string LibFabric::versionText() const {
  return std::to_string(FI_MAJOR(version)) + "." + std::to_string(FI_MINOR(version));
}

}  // namespace mojoccl
