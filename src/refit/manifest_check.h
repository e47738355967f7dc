// Limits on what a trainer's manifest may name, checked before anything is planned or logged:
// the tensor count (limits.max_tensors) and each tensor name (limits.max_name_bytes, and no NUL
// or other control byte). Bucket headers get the same name check from CheckTensorName.
//
// Errors name the tensor by its index and by a printable, shortened form of its name
// (PrintableName), so the error text itself carries no NUL, newline or megabytes of name
// into logs, exception descriptions and C strings.
//
// Thread-safe (pure functions).
#ifndef REFIT_REFIT_MANIFEST_CHECK_H_
#define REFIT_REFIT_MANIFEST_CHECK_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "refit/types.h"

namespace refit {

// Bytes of a name shown in an error before it is cut (with its full length said).
inline constexpr size_t kMaxNameBytesShown = 128;

// `name` quoted-free and printable: control bytes, DEL, backslash and non-ASCII bytes as \xNN,
// cut after kMaxNameBytesShown bytes with "...(N bytes)".
std::string PrintableName(absl::string_view name);

// InvalidArgument naming `where` (e.g. "manifest tensor 3") when `name` is empty, longer than
// limits.max_name_bytes, or holds a byte below 0x20 or 0x7F.
absl::Status CheckTensorName(absl::string_view name, const SessionLimits& limits, absl::string_view where);

// The manifest's tensor count and every tensor name; the first problem found.
absl::Status CheckManifest(const Manifest& manifest, const SessionLimits& limits);

}  // namespace refit

#endif  // REFIT_REFIT_MANIFEST_CHECK_H_
