// Whether a TCPStore's server is still there, known without asking it.
//
// Where a rank hosts the store (mp.spawn, Lightning's launcher, a plain
// init_process_group with MASTER_ADDR) and ends first, every later call on
// the store fails, and torch's store client prints a warning with a C++
// backtrace on each. So each process keeps one idle connection of its own
// to each store server it uses: it reads end-of-file the moment the server
// goes, and the groups stop calling a store that is gone. An end is
// confirmed by connecting again: a connection something on the way dropped
// for being idle is replaced, not taken for the server's end.
//
// No torch headers here.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
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

  // True once the connection ended and the server refuses a new one (its
  // process ended).
  bool gone();

 private:
  StoreWatch(std::string host, uint16_t port, int socket)
      : host_(std::move(host)), port_(port), socket_(socket) {}
  const std::string host_;
  const uint16_t port_;
  std::mutex mutex_;
  int socket_;
  bool gone_ = false;
};

}  // namespace torch_mojo
