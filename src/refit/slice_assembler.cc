#include "refit/slice_assembler.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace refit {

absl::StatusOr<std::optional<SliceAssembler::Whole>> SliceAssembler::Add(const TensorDesc& s, const uint8_t* src) {
  if (absl::Status st = CheckSliceGeometry(s.name, s.shape, s.slice); !st.ok()) {
    absl::MutexLock lock(&mu_);
    if (auto it = pending_.find(s.name); it != pending_.end()) {
      held_ -= it->second.bytes;
      pending_.erase(it);
    }
    dropped_.insert(s.name);
    return st;
  }
  absl::StatusOr<uint64_t> full_bytes = DenseBytes(s.dtype, s.slice.full_shape);
  if (!full_bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", s.name, "': ", full_bytes.status().message()));
  }
  absl::MutexLock lock(&mu_);
  if (dropped_.count(s.name) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", s.name, "': slice refused after an earlier bad slice"));
  }
  auto drop = [&](const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (auto it = pending_.find(s.name); it != pending_.end()) {
      held_ -= it->second.bytes;
      pending_.erase(it);
    }
    dropped_.insert(s.name);
    return absl::InvalidArgumentError(absl::StrCat("tensor '", s.name, "': ", why));
  };
  auto it = pending_.find(s.name);
  if (it == pending_.end()) {
    if (held_ + *full_bytes > limit_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat("tensor '", s.name, "': assembling its slices needs ",
                                                       *full_bytes, " bytes beyond the ", limit_bytes_,
                                                       "-byte limit (", held_, " held)"));
    }
    absl::StatusOr<std::shared_ptr<uint8_t>> data = memory_.Allocate(std::max<uint64_t>(*full_bytes, 1));
    if (!data.ok()) return data.status();
    held_ += *full_bytes;
    it = pending_.emplace(s.name, Pending{s.dtype, s.slice.full_shape, s.slice.dim, *full_bytes, *data, {}, 0}).first;
  }
  Pending& p = it->second;
  if (p.dtype != s.dtype || p.full != s.slice.full_shape || p.dim != s.slice.dim) {
    return drop(absl::StrCat("slice of ", DTypeName(s.dtype), ShapeString(s.slice.full_shape), " along dimension ",
                             s.slice.dim, " disagrees with earlier slices of ", DTypeName(p.dtype), ShapeString(p.full),
                             " along dimension ", p.dim));
  }
  const size_t d = static_cast<size_t>(p.dim);
  const uint64_t start = s.slice.start;
  const uint64_t end = start + static_cast<uint64_t>(s.shape[d]);
  // Overlap with an earlier slice: the first slice starting before `end` whose end is past `start`.
  auto next = p.covered.lower_bound(end);
  if (next != p.covered.begin()) {
    auto prev = std::prev(next);
    if (prev->second > start) {
      return drop(absl::StrCat("slice [", start, ", ", end, ") of dimension ", p.dim, " overlaps the slice [",
                               prev->first, ", ", prev->second, ")"));
    }
  }
  // Row-major copy: `outer` runs of `rows * inner` bytes.
  uint64_t outer = 1, inner = DTypeSize(p.dtype);
  for (size_t i = 0; i < d; ++i) outer *= static_cast<uint64_t>(p.full[i]);
  for (size_t i = d + 1; i < p.full.size(); ++i) inner *= static_cast<uint64_t>(p.full[i]);
  const uint64_t rows = end - start, full_rows = static_cast<uint64_t>(p.full[d]);
  for (uint64_t o = 0; o < outer; ++o) {
    uint8_t* dst = p.data.get() + (o * full_rows + start) * inner;
    const uint8_t* from = src + o * rows * inner;
    if (memory_.kind() == storage::MemoryKind::kHost) {
      std::memcpy(dst, from, rows * inner);
    } else if (absl::Status st = memory_.CopyWithin(dst, from, rows * inner); !st.ok()) {
      return st;
    }
  }
  p.covered.emplace(start, end);
  p.covered_rows += rows;
  // The whole tensor's supplied amax: the max over its slices', when every slice had one.
  if (s.amax && p.amax_supplied) {
    p.amax = std::max(p.amax, *s.amax);
  } else {
    p.amax_supplied = false;
  }
  if (p.covered_rows < full_rows) return std::optional<Whole>();
  Whole whole{TensorDesc{s.name, p.dtype, p.full, 0, p.bytes}, std::move(p.data)};
  if (p.amax_supplied) whole.desc.amax = p.amax;
  held_ -= p.bytes;
  pending_.erase(it);
  return std::optional<Whole>(std::move(whole));
}

std::vector<std::string> SliceAssembler::Incomplete() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, p] : pending_) {
    std::vector<std::string> gaps;
    uint64_t at = 0;
    for (const auto& [start, end] : p.covered) {
      if (start > at) gaps.push_back(absl::StrCat("[", at, ", ", start, ")"));
      at = end;
    }
    const uint64_t full_rows = static_cast<uint64_t>(p.full[static_cast<size_t>(p.dim)]);
    if (at < full_rows) gaps.push_back(absl::StrCat("[", at, ", ", full_rows, ")"));
    out.push_back(absl::StrCat("tensor '", name, "': slices cover ", p.covered_rows, " of ", full_rows,
                               " rows of dimension ", p.dim, "; missing ", absl::StrJoin(gaps, ", ")));
  }
  return out;
}

uint64_t SliceAssembler::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

}  // namespace refit
