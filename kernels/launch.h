// Raw launchers of the CUDA kernels, callable from plain C++ (no CUDA types). Internal to
// kernels/: callers use quantize.h, layout.h, derive.h and checksum.h, which validate arguments
// and turn the returned cudaError_t codes (0 = success) into absl::Status.
// Thread-safe: each call only enqueues work on `stream` (a cudaStream_t passed as void*).
#ifndef REFIT_KERNELS_LAUNCH_H_
#define REFIT_KERNELS_LAUNCH_H_

#include <cstdint>

namespace refit::kernels::launch {

// How input elements become fp32: BF16 widened, FP32 as is, or FP32 rounded to BF16 (RNE) first.
enum class Input : int { kBf16 = 0, kF32 = 1, kF32RoundBf16 = 2 };
enum class Output : int { kBf16 = 0, kF16 = 1, kF32 = 2 };

// A dense row-major device tensor viewed as [batch, rows, cols].
struct Src {
  const void* data;
  Input input;
  int64_t batch;
  int64_t rows;
  int64_t cols;
};

// `first_bad` (nullable, device): atomically lowered to the smallest flat index of a non-finite
// input element (or, for PackUe8m0, of a scale that is not a power of two).
int Fp8Block128(const Src& src, bool ue8m0, uint8_t* q, float* scale_inv,
                unsigned long long* first_bad, void* stream);
int Mxfp8(const Src& src, uint8_t* q, uint8_t* scales, unsigned long long* first_bad, void* stream);
int Mxfp4(const Src& src, uint8_t* blocks, uint8_t* scales, unsigned long long* first_bad,
          void* stream);
// Global amax from `amax_dev` (device float) when non-null, else `amax_host`. `claim_word`
// (nullable): lowered to (1 << 63) | the flat index of a block whose max|x| exceeds `claim`.
int Nvfp4(const Src& src, bool te, const float* amax_dev, float amax_host, uint8_t* q,
          uint8_t* scales, float* scale_2, unsigned long long* first_bad, float claim,
          unsigned long long* claim_word, void* stream);
// The compressed-tensors formats (formats/compressed_tensors.h). `scales`/`scale` are BF16 bits.
// CtFp8Tensor and CtNvfp4 take the global amax as Nvfp4 does and check `claim` the same way.
int CtFp8Channel(const Src& src, uint8_t* q, uint16_t* scales, unsigned long long* first_bad, void* stream);
int CtFp8Tensor(const Src& src, const float* amax_dev, float amax_host, uint8_t* q, uint16_t* scale,
                unsigned long long* first_bad, float claim, unsigned long long* claim_word, void* stream);
int CtNvfp4(const Src& src, const float* amax_dev, float amax_host, uint8_t* packed, uint8_t* scales,
            float* global_scale, unsigned long long* first_bad, float claim, unsigned long long* claim_word,
            void* stream);
// `rank` (2 or 3): how many of [batch, rows, cols] the "_shape" output holds.
int CtW4a16(const Src& src, int rank, uint32_t* words, uint16_t* scales, int64_t* shape, unsigned long long* first_bad,
            void* stream);
// *amax_dev = max(*amax_dev, max|x|) with NaN dominating; *amax_dev must hold a value >= +0.
int AccumulateAmax(const Src& src, float* amax_dev, void* stream);
int Cast(const Src& src, Output out_type, void* out, unsigned long long* first_bad, void* stream);

int PackUe8m0(const float* sf, int64_t groups, int64_t mn, int64_t kb, int gran_mn, int32_t* out,
              unsigned long long* first_bad, void* stream);
int Swizzle128x4(const uint8_t* s, int64_t batch, int64_t rows, int64_t cols, uint8_t* out,
                 void* stream);
int TransposeLast2(const void* in, int64_t batch, int64_t rows, int64_t cols, int elem_bytes, void* out,
                   void* stream);
int GemmaPlusOne(const void* w, Output type, int64_t n, void* out, void* stream);
int Checksum(const void* data, uint64_t bytes, uint64_t seed, unsigned long long* result,
             void* stream);

}  // namespace refit::kernels::launch

#endif  // REFIT_KERNELS_LAUNCH_H_
