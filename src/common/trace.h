// A refit's timeline, for latency work across processes. With REFIT_TRACE_FILE set in a
// process's environment, each TracePoint appends one line to that file:
//
//   <pid> <unix time in microseconds> <label>[ <value>]
//
// The trainer (client library), refitd and the engine agent trace the same refit into one file
// (O_APPEND: each line is one write, so processes and threads never interleave within a line);
// tools/trace_timeline.py splits it by refit and prints where the time went. Labels are fixed
// strings naming the step ("daemon.begin_received", "trainer.commit_answered"); docs/operations.md
// lists them. Off by default: then a TracePoint is one relaxed atomic load.
//
// Threading: any thread.
#ifndef REFIT_COMMON_TRACE_H_
#define REFIT_COMMON_TRACE_H_

#include <atomic>
#include <cstdint>

namespace refit {

namespace trace_internal {
// -1: not looked up yet; 0: off; otherwise the file's descriptor + 1.
extern std::atomic<int> state;
int Open();
void Write(int fd, const char* label, const uint64_t* value);
}  // namespace trace_internal

// Whether this process traces (REFIT_TRACE_FILE set and opened).
inline bool TraceOn() {
  int s = trace_internal::state.load(std::memory_order_relaxed);
  if (s < 0) s = trace_internal::Open();
  return s > 0;
}

inline void TracePoint(const char* label) {
  int s = trace_internal::state.load(std::memory_order_relaxed);
  if (s < 0) s = trace_internal::Open();
  if (s > 0) trace_internal::Write(s - 1, label, nullptr);
}

inline void TracePoint(const char* label, uint64_t value) {
  int s = trace_internal::state.load(std::memory_order_relaxed);
  if (s < 0) s = trace_internal::Open();
  if (s > 0) trace_internal::Write(s - 1, label, &value);
}

}  // namespace refit

#endif  // REFIT_COMMON_TRACE_H_
