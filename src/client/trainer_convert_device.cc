// TrainerConverter's GPU half in builds with CUDA kernels (trainer_convert.h): device tensors
// converted by kernels/ on their own device. trainer_convert_no_kernels.cc is the build without.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/trainer_convert.h"
#include "common/device_allocation.h"
#include "common/device_env.h"
#include "formats/format_info.h"
#include "kernels/layout.h"
#include "kernels/quantize.h"
#include "refit/convert.h"

namespace refit::client {

bool TrainerConverter::HasKernels() { return true; }

absl::StatusOr<std::vector<std::shared_ptr<uint8_t>>> TrainerConverter::ConvertDevice(
    const Entry& e, DType dtype, const Shape& shape, const void* data, std::optional<float> global_amax) const {
  absl::StatusOr<PointerInfo> attr = DefaultDeviceEnv().QueryPointer(data);
  if (!attr.ok() || attr->memory != PointerMemory::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "': not CUDA device memory"));
  }
  int previous = 0;
  (void)cudaGetDevice(&previous);
  if (cudaSetDevice(attr->device) != cudaSuccess) {
    return absl::InternalError(absl::StrCat("tensor '", e.name, "': cannot use CUDA device ", attr->device));
  }
  std::vector<std::shared_ptr<uint8_t>> buffers;
  std::vector<formats::MutableBytes> outs;
  absl::Status st = [&]() -> absl::Status {
    absl::StatusOr<std::vector<formats::OutputSpec>> planned =
        formats::PlanOutputs(e.format, dtype, Quantized(e, shape));
    if (!planned.ok()) return planned.status();
    for (const formats::OutputSpec& o : *planned) {
      absl::StatusOr<DeviceAllocation> a = DeviceAllocation::Allocate(attr->device, std::max<uint64_t>(o.bytes, 1));
      if (!a.ok()) return a.status();
      auto holder = std::make_shared<DeviceAllocation>(std::move(*a));
      buffers.push_back(std::shared_ptr<uint8_t>(holder, holder->as<uint8_t>()));
      outs.push_back({buffers.back().get(), o.bytes});
    }
    absl::StatusOr<uint64_t> nbytes = DenseBytes(dtype, shape);
    if (!nbytes.ok()) return nbytes.status();
    formats::ConstTensor in{dtype, shape, data};
    DeviceAllocation transposed;
    if (e.transpose) {
      if (shape.size() < 2)
        return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "': transpose needs rank >= 2"));
      absl::StatusOr<DeviceAllocation> t = DeviceAllocation::Allocate(attr->device, std::max<uint64_t>(*nbytes, 1));
      if (!t.ok()) return t.status();
      transposed = std::move(*t);
      int64_t batch = 1;
      for (size_t i = 0; i + 2 < shape.size(); ++i) batch *= shape[i];
      const int64_t rows = shape[shape.size() - 2], cols = shape[shape.size() - 1];
      if (absl::Status t2 = kernels::TransposeLast2(data, batch, rows, cols, static_cast<int>(DTypeSize(dtype)),
                                                    transposed.get(), nullptr);
          !t2.ok()) {
        return t2;
      }
      in.shape = Quantized(e, shape);
      in.data = transposed.get();
    }
    std::optional<kernels::NonfiniteProbe> probe;
    if (options_.nonfinite == formats::NonfinitePolicy::kReject) {
      absl::StatusOr<kernels::NonfiniteProbe> p = kernels::NonfiniteProbe::Create();
      if (!p.ok()) return p.status();
      probe.emplace(std::move(*p));
      if (absl::Status r = probe->Reset(nullptr); !r.ok()) return r;
    }
    kernels::GlobalAmax amax;
    DeviceAllocation amax_word;
    if (formats::NeedsGlobalAmax(e.format) && global_amax) {
      // The caller's reduced amax (fused group, or every rank's slices), refused when below the
      // bytes' own max|x| (one amax pass and a 4-byte read back), as the host path refuses it.
      absl::StatusOr<DeviceAllocation> a = DeviceAllocation::Allocate(attr->device, sizeof(float));
      if (!a.ok()) return a.status();
      amax_word = std::move(*a);
      if (absl::Status r = kernels::ResetAmax(amax_word.as<float>(), nullptr); !r.ok()) return r;
      if (absl::Status r = kernels::AccumulateAmax(in, options_, amax_word.as<float>(), nullptr); !r.ok()) return r;
      float own = 0.0f;
      if (cudaError_t err = cudaMemcpy(&own, amax_word.get(), sizeof(float), cudaMemcpyDeviceToHost);
          err != cudaSuccess) {
        return absl::InternalError(
            absl::StrCat("tensor '", e.name, "': reading its amax back: ", cudaGetErrorString(err)));
      }
      if (!std::isnan(own) && !(*global_amax >= own)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "': global amax ", *global_amax,
                                                       " is below the tensor's own max|x| ", own));
      }
      amax.host = *global_amax;
    } else if (formats::NeedsGlobalAmax(e.format)) {
      // The tensor's own amax, as refitd's GPU converter computes it (device float, no round trip).
      absl::StatusOr<DeviceAllocation> a = DeviceAllocation::Allocate(attr->device, sizeof(float));
      if (!a.ok()) return a.status();
      amax_word = std::move(*a);
      if (absl::Status r = kernels::ResetAmax(amax_word.as<float>(), nullptr); !r.ok()) return r;
      if (absl::Status r = kernels::AccumulateAmax(in, options_, amax_word.as<float>(), nullptr); !r.ok()) return r;
      amax.device = amax_word.as<float>();
    }
    if (absl::Status q =
            kernels::Quantize(e.format, in, options_, amax, outs, e.name, probe ? &*probe : nullptr, nullptr);
        !q.ok()) {
      return q;
    }
    if (probe) {
      if (absl::Status c = probe->Check(e.name, nullptr); !c.ok()) return c;
    }
    if (cudaError_t err = cudaStreamSynchronize(nullptr); err != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("tensor '", e.name, "': converting on the GPU: ", cudaGetErrorString(err)));
    }
    return absl::OkStatus();
  }();
  (void)cudaSetDevice(previous);
  if (!st.ok()) return st;
  return buffers;
}

}  // namespace refit::client
