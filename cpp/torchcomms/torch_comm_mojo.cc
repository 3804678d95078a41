// TorchCommMojo: torchcomms' calls, each turned into the process group's.
#include "torchcomms/torch_comm_mojo.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include <unistd.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <comms/torchcomms/utils/StoreManager.hpp>
#include <comms/torchcomms/utils/Utils.hpp>

namespace torch_mojo {

namespace {

using torch::comms::ReduceOp;
using RedOpType = ReduceOp::RedOpType;

// The store under a store's prefixes.
c10::intrusive_ptr<c10d::Store> baseOf(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store.get());
  return prefixed != nullptr ? prefixed->getUnderlyingNonPrefixStore() : store;
}

// "host:port" of the TCPStore under `store`, or "" where it is another kind.
std::string tcpAddressOf(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* tcp = dynamic_cast<c10d::TCPStore*>(baseOf(store).get());
  return tcp != nullptr ? tcp->getHost() + ":" + std::to_string(tcp->getPort()) : "";
}

// A handle is "<who>@<store>": who this member is, and the TCPStore its
// communicator was made with (empty if none), where members meet when this
// one is listed first.
constexpr char kStoreMark = '@';

std::string storeAddressIn(const std::string& handle) {
  const size_t mark = handle.rfind(kStoreMark);
  return mark == std::string::npos ? "" : handle.substr(mark + 1);
}

c10d::ReduceOp toC10d(const ReduceOp& op) {
  switch (op.type()) {
    case RedOpType::SUM: return c10d::ReduceOp::SUM;
    case RedOpType::PRODUCT: return c10d::ReduceOp::PRODUCT;
    case RedOpType::MIN: return c10d::ReduceOp::MIN;
    case RedOpType::MAX: return c10d::ReduceOp::MAX;
    case RedOpType::BAND: return c10d::ReduceOp::BAND;
    case RedOpType::BOR: return c10d::ReduceOp::BOR;
    case RedOpType::BXOR: return c10d::ReduceOp::BXOR;
    case RedOpType::AVG: return c10d::ReduceOp::AVG;
    case RedOpType::PREMUL_SUM:
      // The group says what it does with it (the same message as on c10d).
      return std::visit([](const auto& factor) { return c10d::makePreMulSum(factor); },
                        *op.factor());
  }
  TORCH_CHECK_VALUE(false, "unknown torchcomms ReduceOp ", static_cast<int>(op.type()));
}

// torchcomms' per-call timeout where it gives one; kUnsetTimeout lets the
// group's own decide, as on the c10d path.
template <typename Options>
std::chrono::milliseconds timeoutOf(const Options& options) {
  return options.timeout == torch::comms::kNoTimeout ? c10d::kUnsetTimeout : options.timeout;
}

std::vector<int64_t> toInt64(const std::vector<uint64_t>& sizes) {
  return {sizes.begin(), sizes.end()};
}

// What Python decides before a communicator is made (set by the module).
std::function<std::optional<AcceleratorSetup>(const at::Device&)>& preparation() {
  static std::function<std::optional<AcceleratorSetup>(const at::Device&)> prepare;
  return prepare;
}

}  // namespace

// ------------------------------------------------------------------ Work

c10::intrusive_ptr<TorchWorkMojo> TorchWorkMojo::of(c10::intrusive_ptr<c10d::Work> work) {
  auto made = c10::make_intrusive<TorchWorkMojo>(std::move(work));
  made->setStatus(WorkStatus::INPROGRESS);
  return made;
}

void TorchWorkMojo::wait() {
  runWaitPreHooks();
  try {
    work_->wait();
  } catch (...) {
    finishOnce(WorkStatus::ERROR);
    throw;
  }
  finishOnce(WorkStatus::COMPLETED);
  runWaitPostHooks();
}

void TorchWorkMojo::finishOnce(WorkStatus status) {
  if (!finished_.exchange(true)) setStatus(status);
}

void TorchWorkMojo::followGroupWork() {
  c10::intrusive_ptr<TorchWorkMojo> self = c10::intrusive_ptr<TorchWorkMojo>::reclaim_copy(this);
  work_->getFuture()->addCallback([self](c10::ivalue::Future& future) {
    self->finishOnce(future.hasError() ? WorkStatus::ERROR : WorkStatus::COMPLETED);
  });
}

void TorchWorkMojo::markCompleted(c10::intrusive_ptr<c10::ivalue::Future> future,
                                  std::vector<at::Tensor> outputs) {
  work_->getFuture()->addCallback([future, outputs](c10::ivalue::Future& done) {
    if (done.hasError())
      future->setError(done.exception_ptr());
    else
      future->markCompleted(c10::IValue(outputs));
  });
}

// ----------------------------------------------------------- life

void TorchCommMojo::setPreparation(
    std::function<std::optional<AcceleratorSetup>(const at::Device&)> prepare) {
  preparation() = std::move(prepare);
}

TorchCommMojo::~TorchCommMojo() {
  if (group_) group_->shutdown();
}

void TorchCommMojo::init(at::Device device, const std::string& name,
                         const torch::comms::CommOptions& options) {
  TORCH_CHECK(!group_ && handle_.empty(), "the mojo communicator '", name_, "' is already initialised");
  c10::intrusive_ptr<c10d::Store> store;
  if (!options.store) {
    // torchcomms' own rendezvous (MASTER_ADDR, MASTER_PORT).
    store = torch::comms::createPrefixStore(name, options.timeout);
  } else if (options.getHint<bool>("persistent_store", false)) {
    store = options.store;  // already this communicator's (torch's per-group prefix)
  } else {
    store = c10::make_intrusive<c10d::PrefixStore>("mojo/" + name, options.store);
  }
  std::optional<AcceleratorSetup> accelerator;
  if (preparation()) accelerator = preparation()(device);
  handle_ = initHandleFor(name) + kStoreMark + tcpAddressOf(store);
  if (options.enable_reconfigure) {
    // The dynamic regime: the peers are known at reconfigure().
    device_ = device;
    name_ = name;
    options_ = options;
    options_.store = nullptr;
    reconfigureStore_ = std::move(store);
    accelerator_ = std::move(accelerator);
    return;
  }
  const auto [rank, size] = torch::comms::query_ranksize();
  std::vector<uint64_t> globalRanks;
  for (int each = 0; each < size; ++each) globalRanks.push_back(each);
  open(device, name, options, rank, size, std::move(globalRanks), std::move(store),
       std::move(accelerator), StoreScope::Job);
}

void TorchCommMojo::open(at::Device device, const std::string& name,
                         const torch::comms::CommOptions& options, int rank, int size,
                         std::vector<uint64_t> globalRanks, c10::intrusive_ptr<c10d::Store> store,
                         std::optional<AcceleratorSetup> accelerator, StoreScope scope) {
  device_ = device;
  name_ = name;
  options_ = options;
  options_.store = nullptr;  // the group keeps the store; the options are only read back
  rank_ = rank;
  size_ = size;
  globalRanks_ = globalRanks;
  store_ = store;
  scope_ = scope;
  accelerator_ = accelerator;
  group_ = c10::make_intrusive<ProcessGroupMojo>(store, rank, size, options.timeout,
                                                 std::move(globalRanks), std::move(accelerator), scope);
  // c10d names its groups itself; here the communicator's name is the one
  // the flight recorder and the watchdog's reports show.
  group_->setGroupUid(name);
  group_->setGroupDesc(name);
  if (!options.abort_process_on_timeout_or_error)
    group_->raiseErrorsInCaller("abort_process_on_timeout_or_error=False");
  group_->onFailure([this] { runAbortHooks(); });
  version_ = "mojoccl " + std::to_string(group_->libraryVersion());
}

std::string TorchCommMojo::initHandleFor(const std::string& name) {
  // Unique to this communicator of this process, and the same across its
  // reconfigures: the others find its rank by it in every handle list.
  static std::atomic<uint64_t> made{0};
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return "mojo:" + std::string(host) + ":" + std::to_string(getpid()) + ":" + name + ":" +
         std::to_string(made++);
}

c10::intrusive_ptr<torch::comms::TorchWork> TorchCommMojo::reconfigure(
    const torch::comms::ReconfigureOptions& opts) {
  TORCH_CHECK(options_.enable_reconfigure, "reconfigure: the mojo communicator '", name_,
              "' was made without enable_reconfigure=True");
  // An ordered list ranks its members as listed (a shrink keeps their
  // order); a set has no order, so every member sorts it alike.
  std::vector<std::string> handles = std::visit(
      [](const auto& given) { return std::vector<std::string>(given.begin(), given.end()); },
      opts.handles);
  if (std::holds_alternative<std::unordered_set<std::string>>(opts.handles))
    std::sort(handles.begin(), handles.end());
  auto mine = std::find(handles.begin(), handles.end(), handle_);
  TORCH_CHECK(mine != handles.end(), "reconfigure: this rank's init handle (", handle_,
              ") is not among the ", handles.size(), " handles given; pass every member's "
              "getInitHandle(), this one's included");
  TORCH_CHECK(std::set<std::string>(handles.begin(), handles.end()).size() == handles.size(),
              "reconfigure: a handle is listed twice");
  if (group_) {
    // Aborted (a peer died, or the caller gave up on it): its calls end at
    // once; otherwise the calls queued on it finish first.
    if (aborted_) group_->abort(); else group_->shutdown();
    group_.reset();
  }
  torch::comms::CommOptions options = options_;
  if (opts.timeout) options.timeout = *opts.timeout;
  std::vector<uint64_t> members;
  for (size_t each = 0; each < handles.size(); ++each) members.push_back(each);
  // The members meet at the first one's store, under its handle and the
  // reconfigure's uuid, which they all pass.
  auto meeting = c10::make_intrusive<c10d::PrefixStore>(
      "mojo_reconfigure/" + handles.front() + "/" + std::to_string(opts.uuid),
      storeOfFirstMember(handles.front(), options.timeout));
  open(device_, name_, options, static_cast<int>(mine - handles.begin()),
       static_cast<int>(handles.size()), std::move(members), std::move(meeting), accelerator_,
       StoreScope::Group);
  options_.enable_reconfigure = true;  // open() copied the options of this round
  aborted_ = false;
  return c10::make_intrusive<torch::comms::TorchWorkCompleted>();
}

c10::intrusive_ptr<c10d::Store> TorchCommMojo::storeOfFirstMember(
    const std::string& first, std::chrono::milliseconds timeout) {
  // Members of other jobs (torchft's replica groups, each under its own
  // torchrun) share no store but the one the first handle names.
  const std::string address = storeAddressIn(first);
  if (address.empty() || address == tcpAddressOf(reconfigureStore_)) return baseOf(reconfigureStore_);
  if (address != meetingAddress_) {
    const size_t colon = address.rfind(':');
    TORCH_CHECK_VALUE(colon != std::string::npos, "reconfigure: the first handle (", first,
                      ") names no store to meet at; pass handles from getInitHandle()");
    c10d::TCPStoreOptions client;
    client.port = static_cast<uint16_t>(std::stoi(address.substr(colon + 1)));
    client.isServer = false;
    client.waitWorkers = false;
    client.timeout = timeout;
    meetingStore_ = c10::make_intrusive<c10d::TCPStore>(address.substr(0, colon), client);
    meetingAddress_ = address;  // kept: quorums keep their first member for long
  }
  return meetingStore_;
}

void TorchCommMojo::finalize() {
  if (group_) group_->shutdown();
}

void TorchCommMojo::abort() {
  aborted_ = true;
  runAbortHooks();
  if (group_) group_->abortCommunicator("the torchcomms communicator '" + name_ + "' was aborted");
}

void TorchCommMojo::setTimeout(std::chrono::milliseconds timeout) {
  options_.timeout = timeout;
  group().setTimeout(timeout);
}

ProcessGroupMojo& TorchCommMojo::group() const {
  TORCH_CHECK(group_, "the mojo communicator '", name_, "' has no group: ",
              options_.enable_reconfigure ? "call reconfigure() with its members' init handles first"
                                          : "call init() first");
  return *group_;
}

namespace {

// "<size>-<FNV-1a of the list>": short at any group size, and the same on
// every member.
std::string membersKey(const std::vector<int>& ranks) {
  std::string list;
  for (int rank : ranks) list += std::to_string(rank) + ",";
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : list) hash = (hash ^ c) * 1099511628211ull;
  char text[48];
  std::snprintf(text, sizeof(text), "%zu-%016llx", ranks.size(), static_cast<unsigned long long>(hash));
  return text;
}

}  // namespace

std::shared_ptr<torch::comms::TorchCommBackend> TorchCommMojo::split(
    const std::vector<int>& ranks, const std::string& name,
    const torch::comms::CommOptions& options) {
  if (ranks.empty()) return nullptr;  // not a member of any new group
  // RuntimeError, as torchcomms documents split's errors.
  std::set<int> distinct;
  for (int rank : ranks) {
    TORCH_CHECK(rank >= 0 && rank < size_, "split: rank ", rank,
                " is not a rank of this communicator of ", size_);
    TORCH_CHECK(distinct.insert(rank).second, "split: rank ", rank, " is listed twice");
  }
  auto self = std::find(ranks.begin(), ranks.end(), rank_);
  TORCH_CHECK(self != ranks.end(), "split: rank ", rank_,
              " is not in the ranks it passed; a rank outside the new group passes []");
  // The members meet under their list of ranks and how many groups of that
  // list they have made: only the members need to call. Not under the name:
  // torch 2.13 names a new_group after the ranks and the number of groups
  // the caller is in, so members that were in different groups before
  // give it different names.
  const std::string key = membersKey(ranks);
  const std::string prefix = "mojo_split/" + key + "/" + std::to_string(splits_[key]++);
  std::vector<uint64_t> members;
  for (int rank : ranks) members.push_back(globalRanks_[rank]);
  torch::comms::CommOptions childOptions = options;
  if (options.timeout == torch::comms::kDefaultTimeout) childOptions.timeout = options_.timeout;
  auto child = std::make_shared<TorchCommMojo>();
  child->open(device_, name, childOptions, static_cast<int>(self - ranks.begin()),
              static_cast<int>(ranks.size()), std::move(members),
              c10::make_intrusive<c10d::PrefixStore>(prefix, store_), accelerator_, scope_);
  return child;
}

// ------------------------------------------------------------- calls

TorchCommMojo::Work TorchCommMojo::run(bool async_op,
                                       const std::function<c10::intrusive_ptr<c10d::Work>()>& call) {
  auto work = TorchWorkMojo::of(call());
  if (async_op) {
    work->followGroupWork();
  } else {
    work->wait();  // on a device: the current stream waits, not the host
  }
  return work;
}

TorchCommMojo::Work TorchCommMojo::coalesced(bool async_op,
                                             const std::function<void()>& calls) {
  return run(async_op, [&] {
    group().startCoalescing();
    try {
      calls();
    } catch (...) {
      group().endCoalescing();  // the batch is dropped with the error
      throw;
    }
    return group().endCoalescing();
  });
}

void TorchCommMojo::checkRoot(int root, const char* call) const {
  TORCH_CHECK_VALUE(root >= 0 && root < size_, call, ": root ", root,
                    " is not a rank of this communicator of ", size_);
}

TorchCommMojo::Work TorchCommMojo::send(const at::Tensor& tensor, int dst, bool async_op,
                                        const torch::comms::SendOptions& options) {
  return run(async_op, [&] {
    std::vector<at::Tensor> tensors{tensor};
    return group().send(tensors, dst, options.tag);
  });
}

TorchCommMojo::Work TorchCommMojo::recv(at::Tensor& tensor, int src, bool async_op,
                                        const torch::comms::RecvOptions& options) {
  return run(async_op, [&] {
    std::vector<at::Tensor> tensors{tensor};
    return group().recv(tensors, src, options.tag);
  });
}

TorchCommMojo::Work TorchCommMojo::batch_op_issue(
    const std::vector<torch::comms::BatchSendRecv::P2POp>& ops, bool async_op,
    const torch::comms::BatchP2POptions& /*options*/) {
  using OpType = torch::comms::BatchSendRecv::P2POp::OpType;
  return coalesced(async_op, [&] {
    for (const auto& op : ops) {
      std::vector<at::Tensor> tensors{op.tensor};
      if (op.type == OpType::SEND)
        group().send(tensors, op.peer, 0);
      else
        group().recv(tensors, op.peer, 0);
    }
  });
}

TorchCommMojo::Work TorchCommMojo::broadcast(at::Tensor& tensor, int root, bool async_op,
                                             const torch::comms::BroadcastOptions& options) {
  checkRoot(root, "broadcast");
  return run(async_op, [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().broadcast(tensors, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::all_reduce(at::Tensor& tensor, const ReduceOp& op,
                                              bool async_op,
                                              const torch::comms::AllReduceOptions& options) {
  return run(async_op, [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = toC10d(op);
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().allreduce(tensors, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::reduce(const at::Tensor& tensor, int root, const ReduceOp& op,
                                          bool async_op,
                                          const torch::comms::ReduceOptions& options) {
  checkRoot(root, "reduce");
  return run(async_op, [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::ReduceOptions opts;
    opts.reduceOp = toC10d(op);
    opts.rootRank = root;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().reduce(tensors, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::all_gather(const std::vector<at::Tensor>& tensor_list,
                                              const at::Tensor& tensor, bool async_op,
                                              const torch::comms::AllGatherOptions& options) {
  return run(async_op, [&] {
    std::vector<std::vector<at::Tensor>> outputs{tensor_list};
    std::vector<at::Tensor> inputs{tensor};
    c10d::AllgatherOptions opts;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().allgather(outputs, inputs, opts);
  });
}

// Uneven parts: each rank broadcasts its own, all in one library group.
TorchCommMojo::Work TorchCommMojo::all_gather_v(const std::vector<at::Tensor>& tensor_list,
                                                const at::Tensor& tensor, bool async_op,
                                                const torch::comms::AllGatherOptions& options) {
  TORCH_CHECK_VALUE(static_cast<int>(tensor_list.size()) == size_, "all_gather_v: ",
                    tensor_list.size(), " output tensors for a communicator of ", size_);
  TORCH_CHECK_VALUE(tensor_list[rank_].numel() == tensor.numel(), "all_gather_v: this rank's output ",
                    "has ", tensor_list[rank_].numel(), " elements and its input ", tensor.numel());
  tensor_list[rank_].copy_(tensor);
  return coalesced(async_op, [&] {
    for (int root = 0; root < size_; ++root) {
      std::vector<at::Tensor> part{tensor_list[root]};
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      opts.timeout = timeoutOf(options);
      group().broadcast(part, opts);
    }
  });
}

TorchCommMojo::Work TorchCommMojo::all_gather_single(
    at::Tensor& output, const at::Tensor& input, bool async_op,
    const torch::comms::AllGatherSingleOptions& options) {
  return run(async_op, [&] {
    at::Tensor in = input;
    c10d::AllgatherOptions opts;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group()._allgather_base(output, in, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::reduce_scatter(
    at::Tensor& output, const std::vector<at::Tensor>& input_list, const ReduceOp& op,
    bool async_op, const torch::comms::ReduceScatterOptions& options) {
  return run(async_op, [&] {
    std::vector<at::Tensor> outputs{output};
    std::vector<std::vector<at::Tensor>> inputs{input_list};
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = toC10d(op);
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().reduce_scatter(outputs, inputs, opts);
  });
}

// Uneven parts: a reduce to each part's rank, all in one library group;
// the callers' inputs stay as they were.
TorchCommMojo::Work TorchCommMojo::reduce_scatter_v(
    at::Tensor& output, const std::vector<at::Tensor>& input_list, const ReduceOp& op,
    bool async_op, const torch::comms::ReduceScatterOptions& options) {
  TORCH_CHECK_VALUE(static_cast<int>(input_list.size()) == size_, "reduce_scatter_v: ",
                    input_list.size(), " input tensors for a communicator of ", size_);
  TORCH_CHECK_VALUE(input_list[rank_].numel() == output.numel(), "reduce_scatter_v: this rank's ",
                    "input part has ", input_list[rank_].numel(), " elements and its output ",
                    output.numel());
  return coalesced(async_op, [&] {
    for (int root = 0; root < size_; ++root) {
      at::Tensor part = root == rank_ ? output.copy_(input_list[root]) : input_list[root].clone();
      std::vector<at::Tensor> tensors{part};
      c10d::ReduceOptions opts;
      opts.reduceOp = toC10d(op);
      opts.rootRank = root;
      opts.timeout = timeoutOf(options);
      group().reduce(tensors, opts);
    }
  });
}

TorchCommMojo::Work TorchCommMojo::reduce_scatter_single(
    at::Tensor& output, const at::Tensor& input, const ReduceOp& op, bool async_op,
    const torch::comms::ReduceScatterSingleOptions& options) {
  return run(async_op, [&] {
    at::Tensor in = input;
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = toC10d(op);
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group()._reduce_scatter_base(output, in, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::all_to_all_single(
    at::Tensor& output, const at::Tensor& input, bool async_op,
    const torch::comms::AllToAllSingleOptions& options) {
  return all_to_all_v_single(output, input, {}, {}, async_op,
                             torch::comms::AllToAllvSingleOptions{{options.hints, options.timeout}});
}

TorchCommMojo::Work TorchCommMojo::all_to_all_v_single(
    at::Tensor& output, const at::Tensor& input, const std::vector<uint64_t>& output_split_sizes,
    const std::vector<uint64_t>& input_split_sizes, bool async_op,
    const torch::comms::AllToAllvSingleOptions& options) {
  return run(async_op, [&] {
    at::Tensor in = input;
    std::vector<int64_t> outputSplits = toInt64(output_split_sizes);
    std::vector<int64_t> inputSplits = toInt64(input_split_sizes);
    c10d::AllToAllOptions opts;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().alltoall_base(output, in, outputSplits, inputSplits, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::all_to_all(const std::vector<at::Tensor>& output_tensor_list,
                                              const std::vector<at::Tensor>& input_tensor_list,
                                              bool async_op,
                                              const torch::comms::AllToAllOptions& options) {
  return run(async_op, [&] {
    std::vector<at::Tensor> outputs = output_tensor_list;
    std::vector<at::Tensor> inputs = input_tensor_list;
    c10d::AllToAllOptions opts;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().alltoall(outputs, inputs, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::barrier(bool async_op,
                                           const torch::comms::BarrierOptions& options) {
  return run(async_op, [&] {
    c10d::BarrierOptions opts;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().barrier(opts);
  });
}

TorchCommMojo::Work TorchCommMojo::scatter(at::Tensor& output_tensor,
                                           const std::vector<at::Tensor>& input_tensor_list,
                                           int root, bool async_op,
                                           const torch::comms::ScatterOptions& options) {
  checkRoot(root, "scatter");
  return run(async_op, [&] {
    std::vector<at::Tensor> outputs{output_tensor};
    std::vector<std::vector<at::Tensor>> inputs;
    if (rank_ == root) inputs.push_back(input_tensor_list);
    c10d::ScatterOptions opts;
    opts.rootRank = root;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().scatter(outputs, inputs, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::gather(const std::vector<at::Tensor>& output_tensor_list,
                                          const at::Tensor& input_tensor, int root, bool async_op,
                                          const torch::comms::GatherOptions& options) {
  checkRoot(root, "gather");
  return run(async_op, [&] {
    std::vector<std::vector<at::Tensor>> outputs;
    if (rank_ == root) outputs.push_back(output_tensor_list);
    std::vector<at::Tensor> inputs{input_tensor};
    c10d::GatherOptions opts;
    opts.rootRank = root;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().gather(outputs, inputs, opts);
  });
}

}  // namespace torch_mojo
