// Fuzz target: the model-spec YAML loader (spec::ParseModelSpec). Any input must give a spec or
// an error naming the line; never a crash, hang or unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "spec/model_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view yaml(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<refit::spec::ModelSpec> spec = refit::spec::ParseModelSpec(yaml, "<fuzz>");
  (void)spec;
  return 0;
}
