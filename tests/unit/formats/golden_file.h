// Reads the layout goldens of tests/golden/layout_data/ (made by tests/golden/make_layout_goldens.py
// from FlashInfer's functions and a transcription of SGLang's, never by refitd).
#ifndef REFIT_TESTS_UNIT_FORMATS_GOLDEN_FILE_H_
#define REFIT_TESTS_UNIT_FORMATS_GOLDEN_FILE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "gtest/gtest.h"

namespace refit::formats::golden {

inline std::unique_ptr<SafetensorsFile> OpenLayoutGolden(const std::string& file) {
  auto f = SafetensorsFile::Open(std::string(REFIT_LAYOUT_GOLDEN_DIR) + "/" + file);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::move(*f) : nullptr;
}

struct GoldenTensor {
  Shape shape;
  std::vector<uint8_t> bytes;
};

inline GoldenTensor Get(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsEntry* e = f.view().Find(name);
  EXPECT_NE(e, nullptr) << "golden tensor '" << name << "' is absent";
  if (e == nullptr) return {};
  std::span<const uint8_t> d = f.view().Data(*e);
  return GoldenTensor{e->shape, std::vector<uint8_t>(d.begin(), d.end())};
}

// The first differing byte, or -1.
inline int64_t FirstDiff(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace refit::formats::golden

#endif  // REFIT_TESTS_UNIT_FORMATS_GOLDEN_FILE_H_
