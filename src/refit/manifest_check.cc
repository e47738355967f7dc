#include "refit/manifest_check.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace refit {

std::string PrintableName(absl::string_view name) {
  std::string out;
  const absl::string_view shown = name.substr(0, kMaxNameBytesShown);
  for (char ch : shown) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7F || c == '\\') {
      absl::StrAppendFormat(&out, "\\x%02X", c);
    } else {
      out.push_back(ch);
    }
  }
  if (shown.size() < name.size()) absl::StrAppend(&out, "...(", name.size(), " bytes)");
  return out;
}

absl::Status CheckTensorName(absl::string_view name, const SessionLimits& limits, absl::string_view where) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty tensor name"));
  if (name.size() > limits.max_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": tensor name '", PrintableName(name), "' of ",
                                                   name.size(), " bytes (limit ", limits.max_name_bytes,
                                                   " bytes, limits.max_name_bytes)"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7F) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor name '", PrintableName(name),
                                                     "' holds control byte ", absl::StrFormat("0x%02X", c),
                                                     " at offset ", i));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckManifest(const Manifest& manifest, const SessionLimits& limits) {
  if (manifest.tensors.size() > limits.max_tensors) {
    return absl::InvalidArgumentError(absl::StrCat("manifest lists ", manifest.tensors.size(), " tensors (limit ",
                                                   limits.max_tensors, ", limits.max_tensors)"));
  }
  for (size_t i = 0; i < manifest.tensors.size(); ++i) {
    absl::Status s = CheckTensorName(manifest.tensors[i].name, limits, absl::StrCat("manifest tensor ", i));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace refit
