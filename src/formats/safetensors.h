// Reading and writing safetensors files (https://github.com/huggingface/safetensors format:
// u64 little-endian header length, JSON header, data section). The reader treats the file as
// untrusted: every length, offset, dtype and shape is bounds- and overflow-checked, offsets
// must tile the data section exactly (no overlaps, gaps or trailing bytes), and errors name
// the offending tensor or field.
// Thread-safety: a parsed view and an open file are immutable and may be shared across
// threads; the write function is reentrant.
#ifndef REFIT_FORMATS_SAFETENSORS_H_
#define REFIT_FORMATS_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "formats/format.h"

namespace refit::formats {

struct SafetensorsLimits {
  uint64_t max_header_bytes = uint64_t{100} << 20;
};

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;  // offsets within the data section
  uint64_t end;
};

using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;

// A parsed file over bytes owned elsewhere.
class SafetensorsView {
 public:
  static absl::StatusOr<SafetensorsView> Parse(std::span<const uint8_t> file,
                                               const SafetensorsLimits& limits = {});

  // In header order.
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  const SafetensorsEntry* Find(std::string_view name) const;
  std::span<const uint8_t> Data(const SafetensorsEntry& e) const {
    return data_.subspan(e.begin, e.end - e.begin);
  }
  ConstTensor Tensor(const SafetensorsEntry& e) const {
    return ConstTensor{e.dtype, e.shape, data_.data() + e.begin};
  }

 private:
  std::span<const uint8_t> data_;
  std::vector<SafetensorsEntry> tensors_;
  SafetensorsMetadata metadata_;
};

// A read-only memory mapping of a whole file; unmapped on destruction.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const uint8_t> bytes() const { return {addr_, size_}; }

 private:
  MappedFile(const uint8_t* addr, size_t size) : addr_(addr), size_(size) {}
  const uint8_t* addr_;
  size_t size_;
};

// An open, validated safetensors file.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path,
                                                               const SafetensorsLimits& limits = {});
  const SafetensorsView& view() const { return view_; }

 private:
  SafetensorsFile(std::unique_ptr<MappedFile> map, SafetensorsView view)
      : map_(std::move(map)), view_(std::move(view)) {}
  std::unique_ptr<MappedFile> map_;
  SafetensorsView view_;
};

// One tensor to write: either `bytes` (exactly its dense size) or `fill`, called once with a
// buffer of that size to produce the bytes (so large outputs stream one tensor at a time).
struct SafetensorsWriteEntry {
  std::string name;
  DType dtype;
  Shape shape;
  std::span<const uint8_t> bytes;
  std::function<absl::Status(std::span<uint8_t>)> fill;
};

enum class HeaderOrder : uint8_t { kGiven, kSortedByName };

struct SafetensorsWriteOptions {
  HeaderOrder order = HeaderOrder::kGiven;
  SafetensorsMetadata metadata;  // written as "__metadata__" when non-empty
};

// Writes `path` atomically (a temporary file renamed into place). The header is padded with
// spaces to a multiple of 8 bytes; data follows in header order. Duplicate or empty names,
// and bytes that do not match dtype x shape, are InvalidArgument.
absl::Status WriteSafetensors(const std::string& path, std::span<const SafetensorsWriteEntry> entries,
                              const SafetensorsWriteOptions& options = {});

}  // namespace refit::formats

#endif  // REFIT_FORMATS_SAFETENSORS_H_
