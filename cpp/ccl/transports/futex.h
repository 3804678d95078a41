// Counters in shared memory that one process advances and others wait on:
// a short spin, then a futex sleep that the publisher ends.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

namespace mojoccl {

struct alignas(64) Counter {
  std::atomic<uint32_t> value;
  std::atomic<uint32_t> waiters;
};

// Wrap-around safe "value has reached target".
inline bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

inline void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Stores `value` and wakes whoever sleeps on the counter.
inline void publish(Counter& counter, uint32_t value) {
  counter.value.store(value, std::memory_order_seq_cst);
  if (counter.waiters.load(std::memory_order_seq_cst) > 0) futexWakeAll(&counter.value);
}

// Adds one and wakes sleepers: a doorbell.
inline void ring(Counter& counter) {
  counter.value.fetch_add(1, std::memory_order_seq_cst);
  if (counter.waiters.load(std::memory_order_seq_cst) > 0) futexWakeAll(&counter.value);
}

// Sleeps while the counter still reads `seen`, for at most `nanoseconds`.
// The waiter announces itself before the last look, so that a publisher
// either sees it waiting or it sees the new value (both sequentially
// consistent): no wake-up is lost.
inline void sleepWhile(Counter& counter, uint32_t seen, long nanoseconds) {
  counter.waiters.fetch_add(1, std::memory_order_seq_cst);
  if (counter.value.load(std::memory_order_seq_cst) == seen) {
    timespec timeout{0, nanoseconds};
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&counter.value), FUTEX_WAIT, seen, &timeout,
            nullptr, 0);
  }
  counter.waiters.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace mojoccl
