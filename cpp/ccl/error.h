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

// Ranks disagree on the collective they call. Every rank detects it in the
// same step, so the communicator stays usable.
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
