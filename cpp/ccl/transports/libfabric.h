// libfabric, loaded with dlopen when a communicator first spans nodes, so
// that one build runs against whichever libfabric a site installed (the
// Cray one on Slingshot, the distribution's elsewhere).
//
// Only the entry points libfabric exports are looked up here; everything
// else in its API is inline in its headers and calls through the objects
// these return.
#pragma once

#include <signal.h>

#include <string>
#include <vector>

#include <rdma/fabric.h>

namespace mojoccl {

struct LibFabric {
  std::string path;  // the file that was loaded
  uint32_t version;  // fi_version(): FI_MAJOR/FI_MINOR
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const fi_info*, fi_info**);
  void (*freeinfo)(fi_info*);
  fi_info* (*dupinfo)(const fi_info*);
  int (*fabric)(fi_fabric_attr*, fid_fabric**, void*);
  const char* (*strerror)(int);

  // Loaded once per process, in the guide's order: MOJOCCL_LIBFABRIC, the
  // site's library (the TORCH_MOJO_LIBFABRIC_LIBRARY build option), the
  // system loader, the Cray install. Throws when none loads.
  static const LibFabric& get();

  // The providers libfabric offers here (e.g. "tcp;ofi_rxm"), each once.
  std::vector<std::string> providers() const;
  std::string versionText() const;
};

// Keeps the process's handlers of the signals that end it (SIGTERM, SIGINT,
// ...) and of the crash signals across libfabric calls that load
// providers: some provider libraries install their own on load (the psm
// provider's libinfinipath exits with status 1 on SIGTERM), which would
// take the program's and torch-mojo's SIGTERM report away. Restored on
// destruction where a call changed them.
class SignalHandlersKept {
 public:
  SignalHandlersKept();
  ~SignalHandlersKept();
  SignalHandlersKept(const SignalHandlersKept&) = delete;
  SignalHandlersKept& operator=(const SignalHandlersKept&) = delete;

 private:
  static constexpr int kSignals[] = {SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGABRT,
                                     SIGSEGV, SIGBUS, SIGILL, SIGFPE};
  struct sigaction saved_[sizeof(kSignals) / sizeof(kSignals[0])];
};

}  // namespace mojoccl
