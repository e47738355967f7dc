// The GPU entry point of every format: the device twin of formats' descriptor table
// (formats/format_info.h), a parallel constant table indexed by the same Format enum, so that
// the CPU table stays free of CUDA and formats never depends on kernels. Internal to kernels/:
// callers use quantize.h, which validates arguments from the CPU row and then calls the entry.
// Thread-safe: the table is immutable; entries only enqueue work on the given stream.
#ifndef REFIT_KERNELS_QUANTIZE_TABLE_H_
#define REFIT_KERNELS_QUANTIZE_TABLE_H_

#include <cstdint>
#include <span>

#include "formats/format.h"
#include "kernels/launch.h"
#include "kernels/quantize.h"

namespace refit::kernels {

struct GpuQuantizeArgs {
  launch::Src src;
  std::span<const formats::MutableBytes> outs;  // one per output of the format's row, sizes checked
  GlobalAmax amax;                              // resolved (checked) for formats with a global amax
  unsigned long long* first_bad;                // nullable: record non-finite input there
  void* stream;
  unsigned long long* claim_word = nullptr;     // amax.claim set: where an exceeded claim is recorded

  uint8_t* bytes(size_t i) const { return static_cast<uint8_t*>(outs[i].data); }
  float* floats(size_t i) const { return static_cast<float*>(outs[i].data); }
};

// Enqueues the kernels; returns a cudaError_t code (0 = success).
using GpuQuantizeFn = int (*)(const GpuQuantizeArgs& args);

struct GpuFormat {
  formats::Format format;
  GpuQuantizeFn quantize;
};

// REQUIRES: `f` is an enumerator of Format.
const GpuFormat& GpuInfo(formats::Format f);

}  // namespace refit::kernels

#endif  // REFIT_KERNELS_QUANTIZE_TABLE_H_
