// UTF-8 well-formedness, which Prometheus requires of HELP text and label values.
// Thread-safe: pure functions.
#ifndef REFIT_METRICS_UTF8_H_
#define REFIT_METRICS_UTF8_H_

#include <cstddef>
#include <string_view>

namespace refit::metrics {

// Length (1-4) of the well-formed UTF-8 sequence starting at text[pos], or 0 when the bytes
// there are not one (stray continuation byte, truncated or overlong sequence, surrogate, or a
// code point past U+10FFFF). REQUIRES: pos < text.size().
size_t Utf8SequenceLength(std::string_view text, size_t pos);

bool IsValidUtf8(std::string_view text);

}  // namespace refit::metrics

#endif  // REFIT_METRICS_UTF8_H_
