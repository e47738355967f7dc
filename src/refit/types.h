// Value types of the refit core: what trainers declare and send, independent of any wire format.
// The server translates Cap'n Proto messages into these at the edge.
#ifndef REFIT_REFIT_TYPES_H_
#define REFIT_REFIT_TYPES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace refit {

// A part of an HF tensor along one dimension, e.g. a tensor-parallel shard: the bytes carry
// indices [start, start + shape[dim]) of dimension `dim` of a tensor of `full_shape`; every other
// dimension is whole. refitd assembles a tensor's slices and converts it once they tile it.
struct TensorSlice {
  int32_t dim = -1;  // -1: not a slice (the whole tensor)
  uint64_t start = 0;
  Shape full_shape;
  bool present() const { return dim >= 0; }
};

struct TensorDesc {
  std::string name;
  DType dtype = DType::kBF16;
  Shape shape;          // of the bytes sent (the slice's shape for a slice)
  uint64_t offset = 0;  // inside a bucket
  uint64_t nbytes = 0;
  TensorSlice slice = {};  // bucket announcements only
};

// A BucketHeader seq asking refitd to number the bucket (several trainer ranks per session).
inline constexpr uint32_t kAssignBucketSeq = 0xFFFFFFFFu;

struct BucketHeader {
  uint32_t seq = 0;  // or kAssignBucketSeq
  uint64_t nbytes = 0;
  uint64_t checksum = 0;
  std::vector<TensorDesc> tensors;
};

struct Manifest {
  std::string model;
  std::vector<TensorDesc> tensors;
  bool partial = false;
  uint32_t deadline_ms = 0;
};

struct PhaseTimes {
  double receive_ms = 0, convert_ms = 0, validate_ms = 0, commit_ms = 0, pause_ms = 0, total_ms = 0;
  double plan_ms = 0;     // begin: checking and planning the manifest
  double finish_ms = 0;   // commit requested to the last bucket converted
  double prepare_ms = 0;  // building engine parameters and the copy plan, before the pause
};

struct RefitReport {
  uint64_t session_id = 0;
  uint64_t version = 0;
  std::string outcome;  // committed | refused | aborted | failed
  std::string reason;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint32_t buckets = 0;
  uint32_t tensors = 0;
  PhaseTimes times;
  std::map<std::string, uint64_t> bytes_out_by_format;  // "fp8_block128", "bf16", "passthrough", ...
};

// Limits on what a session may ask for; all from the daemon config, checked before allocation.
struct SessionLimits {
  uint64_t bucket_bytes = 256ull << 20;
  uint32_t bucket_slots = 2;
  uint64_t staging_bytes = 64ull << 30;
  uint32_t max_tensors = 1'000'000;
  uint32_t max_name_bytes = 512;
  uint32_t max_rank = 8;
  uint32_t deadline_ms = 600'000;
};

}  // namespace refit

#endif  // REFIT_REFIT_TYPES_H_
