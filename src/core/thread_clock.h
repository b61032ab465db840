// This thread's CPU time. On a shared or oversubscribed machine wall time also counts the time a
// thread waits or is descheduled; host-side figures (engine step host time, tokenizer and
// grammar benches) count only the thread's own work.
#pragma once
#include <ctime>

namespace ts {

inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace ts
