// Errors inside libmojoccl are C++ exceptions carrying an ncclResult_t; the
// C API (api.cc) turns them into return codes and ncclGetLastError() text.
#pragma once

#include <stdexcept>
#include <string>

#include "mojoccl/nccl.h"

namespace mojoccl {

class Error : public std::runtime_error {
 public:
  Error(ncclResult_t code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ncclResult_t code() const { return code_; }

 private:
  ncclResult_t code_;
};

// Ranks disagree on what they call: a collective, or the size of a message.
// It is found before any data moves (or, for a message, by consuming it),
// so the communicator stays usable.
class MismatchError : public Error {
 public:
  explicit MismatchError(const std::string& message) : Error(ncclInvalidUsage, message) {}
};

[[noreturn]] inline void fail(ncclResult_t code, const std::string& message) {
  throw Error(code, message);
}

// A failed system call: `what` plus strerror(errno).
[[noreturn]] void failSystem(const std::string& what);

}  // namespace mojoccl
