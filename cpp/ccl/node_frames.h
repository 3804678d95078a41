// What the nodes' leaders exchange at the start of every collective between
// nodes: each leader's frame, its node's report on the call, then the
// node's disagreement or the call's data (comm_across_nodes.cc,
// comm_all_to_all.cc).
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>

#include "algorithms/call.h"
#include "comm.h"

namespace mojoccl {

// A disagreement's text, as a leader hands it to its node.
constexpr size_t kVerdictBytes = 512;

// What a node's leader tells the other leaders about a call, at the front
// of its frame: its ranks' call, and the node's own disagreement, if any,
// as `problemBytes` of text right behind the report. Where there is none,
// the data of a small collective follows the report instead (an 8-byte
// all-reduce's frame is 48 bytes: small enough to go inject).
struct NodeReport {
  CallSignature signature;
  uint64_t problemBytes;
  const char* problem() const { return reinterpret_cast<const char*>(this + 1); }
};

// A frame's data, where its node found no disagreement.
inline char* payloadOf(char* frame) { return frame + sizeof(NodeReport); }

inline void copyText(char* to, const std::string& text) { std::snprintf(to, kVerdictBytes, "%s", text.c_str()); }

// Room for any leader's frame: its node's report, then its disagreement or
// the data of a small all-reduce (halves cross in float32, at twice their
// bytes).
constexpr size_t kFrameRoom = sizeof(NodeReport) + std::max(kVerdictBytes, 2 * kOneShotMaxBytes);

}  // namespace mojoccl
