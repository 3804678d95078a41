#include "network.h"

#include <vector>

#include "../datatypes.h"
#include "../kernels.h"
#include "layout.h"

namespace mojoccl {

void networkAllReduce(const NetworkGroup& group, void* data, size_t count, ncclDataType_t datatype,
                      ncclRedOp_t op) {
  const int n = group.size();
  if (n == 1) return;
  const size_t size = datatypeSize(datatype);
  const int next = group.ranks[(group.self + 1) % n];
  const int previous = group.ranks[(group.self + n - 1) % n];
  auto slice = [&](int index) { return sliceOf(count, n, ((index % n) + n) % n, size); };
  std::vector<char> incoming(slice(0).end * size);

  // Reduce-scatter: at step s we pass on slice (self - s) and fold slice
  // (self - s - 1) arriving from behind into ours; slice self + 1 ends whole.
  for (int step = 0; step < n - 1; ++step) {
    Slice out = slice(group.self - step), in = slice(group.self - step - 1);
    group.fabric.postSend(next, bytesAt(data, out.begin, size), (out.end - out.begin) * size);
    group.fabric.postRecv(previous, incoming.data(), (in.end - in.begin) * size);
    group.fabric.waitAll(group.what);
    const void* sources[2] = {bytesAt(data, in.begin, size), incoming.data()};
    reduce(bytesAt(data, in.begin, size), sources, 2, in.end - in.begin, datatype, op, 1);
  }
  // All-gather: the whole slices travel once round the ring.
  for (int step = 0; step < n - 1; ++step) {
    Slice out = slice(group.self + 1 - step), in = slice(group.self - step);
    group.fabric.postSend(next, bytesAt(data, out.begin, size), (out.end - out.begin) * size);
    group.fabric.postRecv(previous, bytesAt(data, in.begin, size), (in.end - in.begin) * size);
    group.fabric.waitAll(group.what);
  }
}

void networkBroadcast(const NetworkGroup& group, void* data, size_t bytes, int root) {
  if (group.self == root) {
    for (int member = 0; member < group.size(); ++member)
      if (member != root) group.fabric.postSend(group.ranks[member], data, bytes);
  } else {
    group.fabric.postRecv(group.ranks[root], data, bytes);
  }
  group.fabric.waitAll(group.what);
}

void networkAllGather(const NetworkGroup& group, const std::vector<char*>& blocks,
                      const std::vector<size_t>& blockBytes) {
  for (int member = 0; member < group.size(); ++member) {
    if (member == group.self) continue;
    group.fabric.postRecv(group.ranks[member], blocks[member], blockBytes[member]);
    group.fabric.postSend(group.ranks[member], blocks[group.self], blockBytes[group.self]);
  }
  group.fabric.waitAll(group.what);
}

void networkExchangeFrames(const NetworkGroup& group, const std::vector<char*>& frames, size_t sendBytes,
                           size_t roomBytes, std::vector<size_t>& received) {
  received.assign(group.size(), sendBytes);
  for (int member = 0; member < group.size(); ++member)
    if (member != group.self) group.fabric.postRecvUpTo(group.ranks[member], frames[member], roomBytes, &received[member]);
  for (int member = 0; member < group.size(); ++member)
    if (member != group.self) group.fabric.postSend(group.ranks[member], frames[group.self], sendBytes);
  group.fabric.waitAll(group.what);
}

void networkAllGatherWithHeaders(const NetworkGroup& group, const std::vector<char*>& headers,
                                 size_t headerBytes, std::vector<std::vector<char>>& payloads,
                                 const std::function<size_t(const char* header)>& payloadBytes) {
  const std::vector<char>& ours = payloads[group.self];
  std::vector<HeaderedMessage> messages;
  std::vector<int> sender;  // the member each receive comes from
  for (int member = 0; member < group.size(); ++member) {
    if (member == group.self) continue;
    const int peer = group.ranks[member];
    messages.push_back({true, peer, headers[group.self], ours.data(), ours.size()});
    messages.push_back({false, peer, headers[member], nullptr, 0});
    sender.resize(messages.size(), member);
  }
  exchangeHeadered(group.fabric, messages, headerBytes, [&](size_t index) {
    std::vector<char>& payload = payloads[sender[index]];
    payload.resize(payloadBytes(headers[sender[index]]));
    return std::make_pair(static_cast<void*>(payload.data()), payload.size());
  }, group.what);
}

}  // namespace mojoccl
