#include "common/parallel_copy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common/kept_threads.h"

namespace refit {

namespace {

KeptThreads& PiecePool() {
  // Never destroyed: a range worked on by another thread during exit keeps its helpers.
  static KeptThreads* const pool = new KeptThreads;
  return *pool;
}

size_t DefaultThreads() {
  if (const char* env = std::getenv("REFIT_COPY_THREADS"); env != nullptr && *env != '\0') {
    const long n = std::strtol(env, nullptr, 10);
    if (n >= 1) return static_cast<size_t>(std::min(n, 64L));
  }
  const size_t hw = std::thread::hardware_concurrency();
  return std::clamp<size_t>(hw / 2, 1, 8);
}

}  // namespace

size_t ParallelCopyThreads() {
  static const size_t threads = DefaultThreads();
  return threads;
}

size_t ForEachPiece(size_t bytes, size_t threads, const std::function<void(size_t p, size_t begin, size_t len)>& fn) {
  if (bytes == 0) return 0;
  const size_t split = std::min(threads, bytes / kParallelCopyMinPiece);
  if (split <= 1) {
    fn(0, 0, bytes);
    return 1;
  }
  // Equal pieces on 4 KiB boundaries; the last takes the remainder.
  const size_t piece = (bytes / split + 4095) & ~size_t{4095};
  const size_t pieces = (bytes + piece - 1) / piece;
  std::vector<KeptThreads::Run> runs;
  runs.reserve(pieces - 1);
  for (size_t p = 1; p < pieces; ++p) {
    const size_t begin = p * piece;
    const size_t len = std::min(piece, bytes - begin);
    try {
      runs.push_back(PiecePool().Start([&fn, p, begin, len] { fn(p, begin, len); }));
    } catch (...) {  // no thread could start: this piece on the calling thread
      fn(p, begin, len);
    }
  }
  fn(0, 0, std::min(piece, bytes));
  for (const KeptThreads::Run& r : runs) r.Wait();
  return pieces;
}

void ParallelCopy(void* dst, const void* src, size_t bytes) { ParallelCopy(dst, src, bytes, ParallelCopyThreads()); }

void ParallelCopy(void* dst, const void* src, size_t bytes, size_t threads) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  ForEachPiece(bytes, threads, [d, s](size_t, size_t begin, size_t len) { std::memcpy(d + begin, s + begin, len); });
}

}  // namespace refit
