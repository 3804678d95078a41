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
  // system loader, the Cray install. Throws when none loads. Waits for a
  // load preload() started.
  static const LibFabric& get();

  // Starts loading libfabric in a thread of its own and returns at once: a job across nodes calls it early, so that its
  // first communicator does not wait for the load (hundreds of ms where
  // provider libraries probe for hardware). A fork() meanwhile waits for
  // the load to end, so that no child inherits the dynamic loader's lock
  // held (C libraries before glibc 2.36 keep it so).
  static void preload();

  // The providers libfabric offers here (e.g. "tcp;ofi_rxm"), each once.
  std::vector<std::string> providers() const;
  std::string versionText() const;
};

// Keeps the process's handlers of the signals that end it (SIGTERM, SIGINT,
// ...) and of the crash signals across libfabric calls that load
// providers: some provider libraries install their own on load (the psm
// provider's libinfinipath exits with status 1 on SIGTERM), which would
// take the program's and torch-mojo's SIGTERM report away. On destruction
// a handler is put back where the one now installed is code that libfabric
// brought in (any library loaded since the first guard, around libfabric's
// own load); one the program installed meanwhile from another thread
// (during a preload) stays.
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
