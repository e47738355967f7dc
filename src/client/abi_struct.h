// How the C ABI (c_api.h) reads and writes its versioned structs. Every struct starts with
// `uint32_t struct_size`, the sizeof the caller was compiled with:
//   - a caller older than this library passes a smaller struct: any size from the struct's
//     version-1 size up is accepted, and the fields past the caller's size take their defaults;
//   - a newer caller passes a larger one: the library reads (and writes) only what it knows;
//   - a size below the version-1 size is refused (InvalidArgument).
// Each struct's version-1 size is frozen with REFIT_ABI_V1_SIZE (the end of its last version-1
// field), so that adding a field never refuses the callers compiled before it.
//
// Header-only, for c_api.cc and its tests; the frozen sizes of c_api.h's structs are at the end. Thread-safe: pure functions.
#ifndef REFIT_CLIENT_ABI_STRUCT_H_
#define REFIT_CLIENT_ABI_STRUCT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/c_api.h"

namespace refit::client::abi {

// Specialized for every ABI struct with REFIT_ABI_V1_SIZE; a struct without one does not compile.
template <typename T>
inline constexpr uint32_t kV1Size = T::kNoVersion1SizeDeclared;

// The version-1 size of `type`: the end of `last_v1_field`. Use at namespace scope.
#define REFIT_ABI_V1_SIZE(type, last_v1_field)                                    \
  template <>                                                                     \
  inline constexpr uint32_t refit::client::abi::kV1Size<type> =                   \
      static_cast<uint32_t>(offsetof(type, last_v1_field) + sizeof(type::last_v1_field))

template <typename T>
absl::Status CheckSize(uint32_t size, const char* what) {
  if (size < kV1Size<T>) {
    return absl::InvalidArgumentError(absl::StrCat(what, ".struct_size is ", size,
                                                   ", below the smallest supported size ", kV1Size<T>));
  }
  return absl::OkStatus();
}

// Copies a caller's input struct into `out`, which starts as `defaults`: the caller's first
// struct_size bytes (up to this library's sizeof) replace them; later fields keep their defaults.
// `out->struct_size` is the caller's.
template <typename T>
absl::Status ReadStruct(const T* in, const char* what, T* out, const T& defaults) {
  std::memcpy(static_cast<void*>(out), &defaults, sizeof(T));
  if (in == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " is NULL"));
  if (absl::Status st = CheckSize<T>(in->struct_size, what); !st.ok()) return st;
  std::memcpy(static_cast<void*>(out), in, std::min<size_t>(in->struct_size, sizeof(T)));
  return absl::OkStatus();
}

// As above, with every field the caller did not pass zero (the default of every field so far).
template <typename T>
absl::Status ReadStruct(const T* in, const char* what, T* out) {
  T zero;
  std::memset(static_cast<void*>(&zero), 0, sizeof(T));
  return ReadStruct(in, what, out, zero);
}

// Element `i` of a caller's array, whose elements are the first element's struct_size apart.
template <typename T>
absl::Status ReadElement(const T* array, uint64_t count, uint64_t i, const char* what, T* out) {
  if (array == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " is NULL but its count is ", count));
  const uint32_t stride = array[0].struct_size;
  if (absl::Status st = CheckSize<T>(stride, absl::StrCat(what, "[0]").c_str()); !st.ok()) return st;
  const T* e = reinterpret_cast<const T*>(reinterpret_cast<const char*>(array) + i * stride);
  if (e->struct_size != stride) {
    return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "].struct_size is ", e->struct_size,
                                                   " but ", what, "[0].struct_size is ", stride));
  }
  return ReadStruct(e, what, out);
}

// Copies a filled struct into the caller's, writing only what fits in its struct_size (which is
// kept).
template <typename T>
absl::Status WriteStruct(const T& value, const char* what, T* out) {
  if (out == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " is NULL"));
  const uint32_t size = out->struct_size;
  if (absl::Status st = CheckSize<T>(size, what); !st.ok()) return st;
  std::memcpy(static_cast<void*>(out), &value, std::min<size_t>(size, sizeof(T)));
  out->struct_size = size;
  return absl::OkStatus();
}

}  // namespace refit::client::abi

// Each struct's size in ABI version 1, frozen: the end of its last version-1 field. A field added
// later goes after it, and callers compiled before it keep working.
REFIT_ABI_V1_SIZE(refit_tensor_desc, rank);
REFIT_ABI_V1_SIZE(refit_manifest, deadline_ms);
REFIT_ABI_V1_SIZE(refit_tensor, device);
REFIT_ABI_V1_SIZE(refit_report, format_bytes);
REFIT_ABI_V1_SIZE(refit_daemon_status, data_endpoint);
REFIT_ABI_V1_SIZE(refit_param_checksum, nbytes);
REFIT_ABI_V1_SIZE(refit_engine_param, cuda_device);
REFIT_ABI_V1_SIZE(refit_engine_options, version);
// Structs added after version 1: their first size is frozen the same way.
REFIT_ABI_V1_SIZE(refit_staged_version, session_id);

#endif  // REFIT_CLIENT_ABI_STRUCT_H_
