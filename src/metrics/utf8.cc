#include "metrics/utf8.h"

#include <cstdint>

namespace refit::metrics {

size_t Utf8SequenceLength(std::string_view text, size_t pos) {
  const auto first_byte = static_cast<unsigned char>(text[pos]);
  size_t extra;
  uint32_t code;
  if (first_byte < 0x80) {
    return 1;
  } else if ((first_byte & 0xE0) == 0xC0) {
    extra = 1;
    code = first_byte & 0x1F;
  } else if ((first_byte & 0xF0) == 0xE0) {
    extra = 2;
    code = first_byte & 0x0F;
  } else if ((first_byte & 0xF8) == 0xF0) {
    extra = 3;
    code = first_byte & 0x07;
  } else {
    return 0;
  }
  if (pos + extra >= text.size()) return 0;
  for (size_t k = 1; k <= extra; ++k) {
    const auto cont = static_cast<unsigned char>(text[pos + k]);
    if ((cont & 0xC0) != 0x80) return 0;
    code = (code << 6) | (cont & 0x3F);
  }
  static constexpr uint32_t kMinForLength[] = {0, 0x80, 0x800, 0x10000};
  if (code < kMinForLength[extra] || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) {
    return 0;
  }
  return extra + 1;
}

bool IsValidUtf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = Utf8SequenceLength(text, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

}  // namespace refit::metrics
