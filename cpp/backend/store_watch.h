// Whether a TCPStore's server is still there, known without asking it.
//
// Where a rank hosts the store (mp.spawn, Lightning's launcher, a plain
// init_process_group with MASTER_ADDR) and ends first, every later call on
// the store fails, and torch's store client prints a warning with a C++
// backtrace on each. So each process keeps one idle connection of its own
// to each store server it uses: it reads end-of-file the moment the server
// goes, and the groups stop calling a store that is gone.
//
// No torch headers here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace torch_mojo {

class StoreWatch {
 public:
  // One watch per server and process, shared by the groups that use it;
  // null when the server cannot be reached (then nothing is known).
  static std::shared_ptr<StoreWatch> of(const std::string& host, uint16_t port);
  ~StoreWatch();
  StoreWatch(const StoreWatch&) = delete;
  StoreWatch& operator=(const StoreWatch&) = delete;

  // True once the server has closed the connection (its process ended).
  bool gone() const;

 private:
  explicit StoreWatch(int socket) : socket_(socket) {}
  int socket_;
};

}  // namespace torch_mojo
