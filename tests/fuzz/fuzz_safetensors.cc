// Fuzz target: the safetensors reader (formats::SafetensorsView::Parse). Any file must give a
// view whose every entry lies inside the data section, or an error; never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> file(data, size);
  absl::StatusOr<refit::formats::SafetensorsView> view = refit::formats::SafetensorsView::Parse(file);
  if (!view.ok()) return 0;
  for (const refit::formats::SafetensorsEntry& e : view->tensors()) {
    if (e.begin > e.end) std::abort();  // Parse promised a valid range
    std::span<const uint8_t> bytes = view->Data(e);
    volatile uint8_t sink = bytes.empty() ? 0 : bytes.back();  // touch the last byte (ASAN checks it)
    (void)sink;
  }
  return 0;
}
