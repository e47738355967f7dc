// Host work over large byte ranges on several threads: copies (ParallelCopy) and the
// ParallelChecksum64 of a range (common/parallel_checksum.h: ParallelChecksum64Threads). One
// thread's memcpy or checksum reaches a fraction of a server's memory bandwidth (about 10 GB/s,
// against 40+ GB/s for a handful of threads), and a host refit copies and checksums every byte it
// moves (docs/operations.md "Host copies"). Ranges below 2 x kParallelCopyMinPiece, and hosts of up
// to 3 hardware threads, stay on the calling thread.
//
// Threading: safe to call from any threads at once; the helper threads are kept for the process's
// life (common/kept_threads.h) and shared by all callers.
#ifndef REFIT_COMMON_PARALLEL_COPY_H_
#define REFIT_COMMON_PARALLEL_COPY_H_

#include <cstddef>
#include <functional>

namespace refit {

// No piece of a split range is smaller than this.
inline constexpr size_t kParallelCopyMinPiece = size_t{8} << 20;

// The threads a range uses by default: REFIT_COPY_THREADS when set (1 = always one thread), else
// half the host's hardware threads, at most 8 (read once).
size_t ParallelCopyThreads();

// memcpy(dst, src, bytes) split over up to ParallelCopyThreads() threads (the caller's among
// them). The ranges must not overlap.
void ParallelCopy(void* dst, const void* src, size_t bytes);
// The same on up to `threads` threads.
void ParallelCopy(void* dst, const void* src, size_t bytes, size_t threads);

// Calls fn(p, begin, len) for the pieces of [0, bytes) it splits the range into, piece p of
// `pieces` (the return value), on up to `threads` threads, the calling thread among them, and
// returns once every call returned. Pieces start on 4 KiB boundaries, each about
// max(bytes / threads, kParallelCopyMinPiece) long (one piece, on the calling thread, when the
// range is shorter than two minimum pieces; none when it is empty).
size_t ForEachPiece(size_t bytes, size_t threads, const std::function<void(size_t p, size_t begin, size_t len)>& fn);

}  // namespace refit

#endif  // REFIT_COMMON_PARALLEL_COPY_H_
