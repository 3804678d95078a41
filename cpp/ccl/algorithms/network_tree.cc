// The all-reduce down two binary trees at once (a "double binary tree"):
// each tree reduces half the buffer up to its root and broadcasts the
// result back down, in segments, so that a segment climbs while the next
// ones are still on their way. Where the ring takes 2(n-1) steps, a tree
// takes about 2 log2(n), and with half the data in each tree every member
// sends about twice the buffer, as much as round the ring. Rabenseifner's
// algorithm is as good where the node count is a power of two; the trees
// keep that balance for any node count.
#include <algorithm>
#include <vector>

#include "algorithms/layout.h"
#include "algorithms/network.h"
#include "base/datatypes.h"
#include "base/reduce.h"

namespace mojoccl {

namespace {

// Member positions 0..n-1 in a binary tree where a position's height is
// its lowest set bit: the odd positions are leaves, 0 is the root, and the
// largest power of two below n is its only child. A position p of height b
// has children p - b/2 and the largest p + h (h = b/2, b/4, ...) still
// below n, so that its subtree is every position between p - b and p + b.
struct BinaryTree {
  explicit BinaryTree(int n) : parent(n, -1), children(n) {
    for (int p = 0; p < n; ++p) {
      std::vector<int> below;
      if (p == 0) {
        int top = 1;
        while (top * 2 < n) top *= 2;
        if (n > 1) below.push_back(top);
      } else {
        const int half = (p & -p) / 2;
        if (half > 0) below.push_back(p - half);
        for (int h = half; h > 0; h /= 2)
          if (p + h < n) {
            below.push_back(p + h);
            break;
          }
      }
      for (int child : below) parent[child] = p;
      children[p] = below;
    }
  }
  std::vector<int> parent;                  // -1 at the root
  std::vector<std::vector<int>> children;   // lower position first
};

// One of the two trees: where this member sits in it, and the part of the
// buffer it carries, in segments.
struct TreeRole {
  int parent = -1;            // a group member; -1 at the root
  std::vector<int> children;  // group members, lower position first
  std::vector<Slice> segments;
  std::vector<FabricTransport::Ticket> fromChildren[2], up, down;
};

// The second tree is the first with the positions mirrored (an even count)
// or shifted by one (an odd count): a leaf of one tree (odd positions) is
// mostly inside the other, so no member carries both halves' traffic.
int positionIn(int tree, int member, int n) {
  if (tree == 0) return member;
  return n % 2 == 0 ? n - 1 - member : (member + n - 1) % n;
}

int memberAt(int tree, int position, int n) {
  if (tree == 0) return position;
  return n % 2 == 0 ? n - 1 - position : (position + 1) % n;
}

}  // namespace

TreeLoad treeLoad(int members) {
  const BinaryTree shape(members);
  TreeLoad load{0, 0, 0};
  for (int position = 0; position < members; ++position) {
    int depth = 0;
    for (int p = position; shape.parent[p] >= 0; p = shape.parent[p]) ++depth;
    load.levels = std::max(load.levels, depth);
  }
  for (int member = 0; member < members; ++member) {
    int sent = 0, reduced = 0;
    for (int tree = 0; tree < 2; ++tree) {
      const int position = positionIn(tree, member, members);
      const int children = static_cast<int>(shape.children[position].size());
      sent += (shape.parent[position] >= 0 ? 1 : 0) + children;
      reduced += children;
    }
    load.halvesSent = std::max(load.halvesSent, sent);
    load.halvesReduced = std::max(load.halvesReduced, reduced);
  }
  return load;
}

void networkAllReduceTree(const NetworkGroup& group, void* data, size_t count, ncclDataType_t datatype,
                          ncclRedOp_t op) {
  const int n = group.size();
  if (n == 1) return;
  FabricTransport& fabric = group.fabric;
  const size_t size = datatypeSize(datatype);
  const BinaryTree shape(n);
  // The children's partial sums land in two rooms (one per child), each at
  // its elements' own offset: the two trees' halves do not overlap.
  char* rooms[2] = {group.room.get(0, count * size), group.room.get(1, count * size)};
  TreeRole roles[2];
  for (int tree = 0; tree < 2; ++tree) {
    TreeRole& role = roles[tree];
    const int position = positionIn(tree, group.self, n);
    if (shape.parent[position] >= 0) role.parent = group.ranks[memberAt(tree, shape.parent[position], n)];
    for (int child : shape.children[position]) role.children.push_back(group.ranks[memberAt(tree, child, n)]);
    role.segments = segmentSlices(group, sliceOf(count, 2, tree, size), size);
  }
  auto bytes = [&](Slice piece) { return (piece.end - piece.begin) * size; };
  auto segmentOf = [](const TreeRole& role, size_t step, size_t behind) -> const Slice* {
    return step >= behind && step - behind < role.segments.size() ? &role.segments[step - behind] : nullptr;
  };

  // At step i, in each tree, segment i climbs (a member folds in its
  // children's sums and passes the segment up) and the result of segment
  // i - 2 goes down (a member passes on what its parent sent). Messages
  // between two members match in the order they are posted, and a pair
  // may be parent and child in both trees: every member posts the
  // receives for what its neighbours send at a step in the order they send
  // it, one step ahead, so that each message finds its receive waiting.
  auto expect = [&](size_t step) {
    for (TreeRole& role : roles) {
      if (const Slice* piece = segmentOf(role, step, 0))
        for (size_t c = 0; c < role.children.size(); ++c)
          role.fromChildren[c].push_back(
              fabric.postRecv(role.children[c], rooms[c] + piece->begin * size, bytes(*piece)));
      // The result goes where the segment left from, once it has left.
      if (const Slice* piece = segmentOf(role, step, 2); piece && role.parent >= 0) {
        fabric.waitFor(role.up[step - 2], group.what);
        role.down.push_back(fabric.postRecv(role.parent, bytesAt(data, piece->begin, size), bytes(*piece)));
      }
    }
  };
  size_t steps = 0;
  for (const TreeRole& role : roles) steps = std::max(steps, role.segments.size() + 2);
  expect(0);
  for (size_t i = 0; i < steps; ++i) {
    if (i + 1 < steps) expect(i + 1);
    for (TreeRole& role : roles) {
      if (const Slice* piece = segmentOf(role, i, 0)) {
        char* mine = bytesAt(data, piece->begin, size);
        std::vector<const void*> sources = {mine};
        for (size_t c = 0; c < role.children.size(); ++c) {
          fabric.waitFor(role.fromChildren[c][i], group.what);
          sources.push_back(rooms[c] + piece->begin * size);
        }
        if (sources.size() > 1)
          reduce(mine, sources.data(), static_cast<int>(sources.size()), piece->end - piece->begin, datatype, op, 1);
        if (role.parent >= 0) role.up.push_back(fabric.postSend(role.parent, mine, bytes(*piece)));
      }
      if (const Slice* piece = segmentOf(role, i, 2)) {
        if (role.parent >= 0) fabric.waitFor(role.down[i - 2], group.what);
        for (int child : role.children) fabric.postSend(child, bytesAt(data, piece->begin, size), bytes(*piece));
      }
    }
  }
  fabric.waitAll(group.what);
}

}  // namespace mojoccl
