#include "algorithms/call.h"

#include "base/datatypes.h"

namespace mojoccl {

static const char* kindName(uint32_t kind) {
  switch (static_cast<CallKind>(kind)) {
    case CallKind::AllReduce: return "ncclAllReduce";
    case CallKind::Broadcast: return "ncclBroadcast";
    case CallKind::AllGather: return "ncclAllGather";
    case CallKind::ReduceScatter: return "ncclReduceScatter";
    case CallKind::Reduce: return "ncclReduce";
    case CallKind::AllToAll: return "ncclAllToAllv";
  }
  return "an unknown collective";
}

static bool reduces(uint32_t kind) {
  return kind == static_cast<uint32_t>(CallKind::AllReduce) ||
         kind == static_cast<uint32_t>(CallKind::ReduceScatter) ||
         kind == static_cast<uint32_t>(CallKind::Reduce);
}

static bool hasRoot(uint32_t kind) {
  return kind == static_cast<uint32_t>(CallKind::Broadcast) ||
         kind == static_cast<uint32_t>(CallKind::Reduce);
}

CallSignature CallSignature::of(const Call& call) {
  CallSignature signature{};
  signature.kind = static_cast<uint32_t>(call.kind);
  signature.datatype = call.datatype;
  signature.op = reduces(signature.kind) ? call.op : 0;
  signature.root = hasRoot(signature.kind) ? call.root : 0;
  signature.count = call.count;
  signature.sequence = call.sequence;
  return signature;
}

bool CallSignature::sameCollective(const CallSignature& other) const {
  return kind == other.kind && datatype == other.datatype && op == other.op &&
         root == other.root && count == other.count;
}

std::string CallSignature::describe() const {
  // An all-to-all's counts are each rank's own.
  const bool counted = kind != static_cast<uint32_t>(CallKind::AllToAll);
  std::string text = std::string(kindName(kind)) + "(" + (counted ? "count=" + std::to_string(count) + ", " : "") +
                     datatypeName(static_cast<ncclDataType_t>(datatype));
  if (reduces(kind)) text += std::string(", ") + redOpName(static_cast<ncclRedOp_t>(op));
  if (hasRoot(kind)) text += ", root=" + std::to_string(root);
  return text + ")";
}

CallBuffers CallBuffers::of(const Call& call, size_t sendBytes, size_t recvBytes) {
  auto send = reinterpret_cast<uintptr_t>(call.send);
  auto recv = reinterpret_cast<uintptr_t>(call.recv);
  bool overlap = send < recv + recvBytes && recv < send + sendBytes;
  return CallBuffers{describeBuffer(call.send, sendBytes), describeBuffer(call.recv, recvBytes),
                     static_cast<uint64_t>(send), overlap ? 1u : 0u};
}

std::string Call::describe() const { return CallSignature::of(*this).describe(); }

}  // namespace mojoccl
