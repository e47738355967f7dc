// TrainerConverter's GPU half in builds without CUDA kernels (trainer_convert.h): device tensors
// are refused.
#include "absl/strings/str_cat.h"
#include "client/trainer_convert.h"

namespace refit::client {

bool TrainerConverter::HasKernels() { return false; }

absl::StatusOr<std::vector<std::shared_ptr<uint8_t>>> TrainerConverter::ConvertDevice(const Entry& e, DType,
                                                                                      const Shape&, const void*,
                                                                                      std::optional<float>) const {
  return absl::UnimplementedError(absl::StrCat("tensor '", e.name,
                                               "': this client was built without CUDA kernels; "
                                               "push it from host memory or use wire format bf16"));
}

}  // namespace refit::client
