// TorchCommMojo: the `mojo` backend of torchcomms, torch's second front
// door (TORCH_DISTRIBUTED_USE_TORCHCOMMS=1, or torchcomms.new_comm("mojo")).
//
// It is a door, not a second house: each communicator drives one
// ProcessGroupMojo, and every call becomes that group's c10d call. The
// checks, the job queue, the watchdog, the flight recorder, the timeouts,
// the errors and the TRACE line are the ones the c10d path has, because
// they are the same objects. What is here is only what torchcomms asks
// and c10d does not: its option and ReduceOp types, its Work's status and
// hooks, the uneven forms (all_gather_v, reduce_scatter_v) composed of
// the group's own calls, and split by rank lists.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>  // torchcomms' headers log through glog

#include <comms/torchcomms/TorchCommBackend.hpp>

#include "backend/process_group_mojo.hpp"

namespace torch_mojo {

// A torchcomms Work over the process group's: its status follows the
// group's Work (INPROGRESS, then COMPLETED or ERROR when its future ends),
// which is what fires torchcomms' end hooks and completes c10d's future
// when torch wraps this communicator in its _BackendWrapper.
class TorchWorkMojo : public torch::comms::TorchWork {
 public:
  static c10::intrusive_ptr<TorchWorkMojo> of(c10::intrusive_ptr<c10d::Work> work);

  void wait() override;
  void waitBlocking() override { wait(); }
  // An asynchronous call: its status moves when the group's Work ends, on
  // the thread that ends it.
  void followGroupWork();
  std::chrono::milliseconds getTimeout() const override { return timeout_; }
  void setTimeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 protected:
  // Device tensors: torch's future completes once the group's does, on the
  // streams that waited for it.
  void markCompleted(c10::intrusive_ptr<c10::ivalue::Future> future,
                     std::vector<at::Tensor> outputs) override;

 private:
  template <typename T, typename NullType>
  friend class c10::intrusive_ptr;  // make_intrusive: its count starts right
  explicit TorchWorkMojo(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  // COMPLETED or ERROR, once, whichever of wait() and the group's Work
  // gets there first (torchcomms' end hooks are not to run twice).
  void finishOnce(WorkStatus status);

  c10::intrusive_ptr<c10d::Work> work_;
  std::atomic<bool> finished_{false};
  std::chrono::milliseconds timeout_{std::chrono::milliseconds::max()};
};

class TorchCommMojo : public torch::comms::TorchCommBackend {
 public:
  using Work = c10::intrusive_ptr<torch::comms::TorchWork>;
  using ReduceOp = torch::comms::ReduceOp;

  TorchCommMojo() = default;
  ~TorchCommMojo() override;

  // What Python decides before each communicator is made: reproducible sums
  // from torch's setting, and the library for the device's tensors, found
  // in the guide's order (torch_mojo/torchcomms.py).
  static void setPreparation(
      std::function<std::optional<AcceleratorSetup>(const at::Device&)> prepare);

  void init(at::Device device, const std::string& name,
            const torch::comms::CommOptions& options = {}) override;
  void finalize() override;
  int getRank() const override { return rank_; }
  int getSize() const override { return size_; }
  std::string_view getBackendName() const override { return "mojo"; }
  std::string_view getBackendVersion() const override { return version_; }
  std::string_view getCommName() const override { return name_; }
  const torch::comms::CommOptions& getOptions() const override { return options_; }
  const at::Device& getDevice() const override { return device_; }

  Work send(const at::Tensor& tensor, int dst, bool async_op,
            const torch::comms::SendOptions& options = {}) override;
  Work recv(at::Tensor& tensor, int src, bool async_op,
            const torch::comms::RecvOptions& options = {}) override;
  Work batch_op_issue(const std::vector<torch::comms::BatchSendRecv::P2POp>& ops, bool async_op,
                      const torch::comms::BatchP2POptions& options = {}) override;

  Work broadcast(at::Tensor& tensor, int root, bool async_op,
                 const torch::comms::BroadcastOptions& options = {}) override;
  Work all_reduce(at::Tensor& tensor, const ReduceOp& op, bool async_op,
                  const torch::comms::AllReduceOptions& options = {}) override;
  Work reduce(const at::Tensor& tensor, int root, const ReduceOp& op, bool async_op,
              const torch::comms::ReduceOptions& options = {}) override;
  Work all_gather(const std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor,
                  bool async_op, const torch::comms::AllGatherOptions& options = {}) override;
  Work all_gather_v(const std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor,
                    bool async_op, const torch::comms::AllGatherOptions& options = {}) override;
  Work all_gather_single(at::Tensor& output, const at::Tensor& input, bool async_op,
                         const torch::comms::AllGatherSingleOptions& options = {}) override;
  Work reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& input_list,
                      const ReduceOp& op, bool async_op,
                      const torch::comms::ReduceScatterOptions& options = {}) override;
  Work reduce_scatter_v(at::Tensor& output, const std::vector<at::Tensor>& input_list,
                        const ReduceOp& op, bool async_op,
                        const torch::comms::ReduceScatterOptions& options = {}) override;
  Work reduce_scatter_single(at::Tensor& output, const at::Tensor& input, const ReduceOp& op,
                             bool async_op,
                             const torch::comms::ReduceScatterSingleOptions& options = {}) override;
  Work all_to_all_single(at::Tensor& output, const at::Tensor& input, bool async_op,
                         const torch::comms::AllToAllSingleOptions& options = {}) override;
  Work all_to_all_v_single(at::Tensor& output, const at::Tensor& input,
                           const std::vector<uint64_t>& output_split_sizes,
                           const std::vector<uint64_t>& input_split_sizes, bool async_op,
                           const torch::comms::AllToAllvSingleOptions& options = {}) override;
  Work all_to_all(const std::vector<at::Tensor>& output_tensor_list,
                  const std::vector<at::Tensor>& input_tensor_list, bool async_op,
                  const torch::comms::AllToAllOptions& options = {}) override;
  Work barrier(bool async_op, const torch::comms::BarrierOptions& options = {}) override;
  Work scatter(at::Tensor& output_tensor, const std::vector<at::Tensor>& input_tensor_list,
               int root, bool async_op, const torch::comms::ScatterOptions& options = {}) override;
  Work gather(const std::vector<at::Tensor>& output_tensor_list, const at::Tensor& input_tensor,
              int root, bool async_op, const torch::comms::GatherOptions& options = {}) override;

  // Members pass their group's ranks (of this communicator); the others
  // pass none and get none. The new communicator meets in this one's store.
  std::shared_ptr<TorchCommBackend> split(const std::vector<int>& ranks, const std::string& name,
                                          const torch::comms::CommOptions& options = {}) override;

  void setTimeout(std::chrono::milliseconds timeout) override;
  void setHints(std::unordered_map<std::string, std::string> hints) override {
    options_.hints = std::move(hints);
  }
  // Accepted, and nothing to do: within a node libmojoccl reads peers'
  // tensors in place through its registered pool, and between nodes the
  // fabric registers a buffer when it first sends from it.
  void tensor_register(const at::Tensor& /*tensor*/) override {}
  void tensor_deregister(const at::Tensor& /*tensor*/) override {}
  // torchcomms' fault tolerance (torchft drives it): a communicator made
  // with enable_reconfigure has no peers until reconfigure() names them by
  // their init handles; each reconfigure makes a new group of those ranks
  // (dropping the ranks left out, taking in new ones), the old one aborted
  // or shut down first.
  bool supportsReconfigure() const override { return true; }
  bool isInitialized() const override { return group_ != nullptr; }
  torch::comms::InitHandle getInitHandle() const override { return handle_; }
  c10::intrusive_ptr<torch::comms::TorchWork> reconfigure(
      const torch::comms::ReconfigureOptions& opts) override;
  bool isAbortSupported() const override { return true; }
  bool isAborted() const override { return aborted_.load(); }
  // Ends the calls in progress (they fail within ~50 ms) and every later one.
  void abort() override;

  // The process group this communicator drives (torch_mojo tests read it).
  ProcessGroupMojo& group() const;

 private:
  // Runs `call` on the group; a synchronous call has ended when it returns.
  Work run(bool async_op, const std::function<c10::intrusive_ptr<c10d::Work>()>& call);
  // Several of the group's calls as one library group (startCoalescing).
  Work coalesced(bool async_op, const std::function<void()>& calls);
  void checkRoot(int root, const char* call) const;
  static std::string initHandleFor(const std::string& name);
  // The group this communicator drives, made for init() or split().
  void open(at::Device device, const std::string& name, const torch::comms::CommOptions& options,
            int rank, int size, std::vector<uint64_t> globalRanks,
            c10::intrusive_ptr<c10d::Store> store, std::optional<AcceleratorSetup> accelerator,
            StoreScope scope);
  // The store a reconfigure's members meet at: the one the first handle names.
  c10::intrusive_ptr<c10d::Store> storeOfFirstMember(const std::string& first,
                                                     std::chrono::milliseconds timeout);

  at::Device device_{at::kCPU};
  std::string name_;
  std::string version_;
  torch::comms::CommOptions options_;
  int rank_ = -1;
  int size_ = -1;
  std::vector<uint64_t> globalRanks_;
  c10::intrusive_ptr<c10d::Store> store_;
  StoreScope scope_ = StoreScope::Job;  // a reconfigured group's members come from several jobs
  c10::intrusive_ptr<ProcessGroupMojo> group_;
  std::optional<AcceleratorSetup> accelerator_;
  std::map<std::string, int> splits_;  // how many splits of each name and colour
  std::string handle_;                 // getInitHandle()
  c10::intrusive_ptr<c10d::Store> reconfigureStore_;  // the store this communicator was made with
  std::string meetingAddress_;                        // another job's store, met at last
  c10::intrusive_ptr<c10d::Store> meetingStore_;
  std::atomic<bool> aborted_{false};
};

}  // namespace torch_mojo
