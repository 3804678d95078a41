// TorchCommMojo's life: made (init), reconfigured, split, finalized;
// its calls are in torch_comm_mojo_calls.cc.
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

// What Python decides before a communicator is made (set by the module).
std::function<std::optional<AcceleratorSetup>(const at::Device&)>& preparation() {
  static std::function<std::optional<AcceleratorSetup>(const at::Device&)> prepare;
  return prepare;
}

}  // namespace

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

}  // namespace torch_mojo
