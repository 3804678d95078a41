#include "transports/libfabric.h"

#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

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

// The segments of every object loaded now.
std::vector<std::pair<uintptr_t, uintptr_t>> loadedSegments() {
  std::vector<std::pair<uintptr_t, uintptr_t>> segments;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        auto& found = *static_cast<std::vector<std::pair<uintptr_t, uintptr_t>>*>(out);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& header = info->dlpi_phdr[i];
          if (header.p_type == PT_LOAD)
            found.emplace_back(info->dlpi_addr + header.p_vaddr, info->dlpi_addr + header.p_vaddr + header.p_memsz);
        }
        return 0;
      },
      &segments);
  return segments;
}

// The code loaded before the first SignalHandlersKept: the program's.
const std::vector<std::pair<uintptr_t, uintptr_t>>& programsCode() {
  static const auto segments = loadedSegments();
  return segments;
}

bool isHandler(void (*handler)(int)) {
  return handler != SIG_DFL && handler != SIG_IGN && handler != SIG_ERR;
}

// The state of preload(): fork() waits while it loads (forkWaits).
struct Preload {
  std::mutex mutex;
  std::condition_variable finished;
  bool loading = false;
  std::thread::id loader;
};
Preload& preloadState() {
  static Preload* state = new Preload;  // never destroyed: a fork at exit may still ask
  return *state;
}

void forkWaits() {
  Preload& state = preloadState();
  std::unique_lock<std::mutex> lock(state.mutex);
  if (std::this_thread::get_id() != state.loader) state.finished.wait(lock, [&] { return !state.loading; });
}

void childForgetsTheLoad() {
  new (&preloadState().mutex) std::mutex;  // the child has one thread: no load runs in it
  preloadState().loading = false;
}

}  // namespace

void LibFabric::preload() {
  static std::once_flag once;
  std::call_once(once, [] {
    Preload& state = preloadState();
    {
      std::lock_guard<std::mutex> lock(state.mutex);
      state.loading = true;
    }
    pthread_atfork(forkWaits, nullptr, childForgetsTheLoad);
    std::thread([&state] {
      {
        std::lock_guard<std::mutex> lock(state.mutex);
        state.loader = std::this_thread::get_id();
      }
      try {
        // The library alone: its providers are initialised at the first
        // communicator, once the ranks have agreed on what ofi_rxm reads
        // then (FI_OFI_RXM_EAGER_LIMIT, docs/multinode.md).
        get();
      } catch (const Error&) {
        // Remembered by get(): the first communicator across nodes reports it.
      }
      std::lock_guard<std::mutex> lock(state.mutex);
      state.loading = false;
      state.finished.notify_all();
    }).detach();
  });
}

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
  programsCode();  // taken at the first guard, the one around libfabric's own load
  for (size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], nullptr, &saved_[i]);
}

SignalHandlersKept::~SignalHandlersKept() {
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    struct sigaction now {};
    sigaction(kSignals[i], nullptr, &now);
    // SIG_DFL and SIG_IGN are the program's choices; a function, where it is not the program's own code.
    if (now.sa_handler == saved_[i].sa_handler || !isHandler(now.sa_handler)) continue;
    const auto& programs = programsCode();
    const auto code = reinterpret_cast<uintptr_t>(now.sa_handler);
    const bool theProgramsOwn = std::any_of(programs.begin(), programs.end(), [&](const auto& segment) {
      return code >= segment.first && code < segment.second;
    });
    if (!theProgramsOwn) sigaction(kSignals[i], &saved_[i], nullptr);
  }
}

std::string LibFabric::versionText() const {
  return std::to_string(FI_MAJOR(version)) + "." + std::to_string(FI_MINOR(version));
}

}  // namespace mojoccl
