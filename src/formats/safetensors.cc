#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "formats/message.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "nlohmann/json.hpp"

namespace refit::formats {
namespace {

using Json = nlohmann::ordered_json;
constexpr std::string_view kMetadataKey = "__metadata__";

absl::Status Bad(std::string_view msg) {
  return absl::InvalidArgumentError(Msg("safetensors: ", msg));
}

absl::Status BadTensor(std::string_view name, std::string_view msg) {
  return absl::InvalidArgumentError(Msg("safetensors: tensor '", name, "': ", msg));
}

absl::StatusOr<uint64_t> ReadUnsigned(const nlohmann::json& j, std::string_view name, std::string_view field) {
  if (!j.is_number_unsigned()) {
    return BadTensor(name, Msg(field, " must hold non-negative integers, got ", j.dump()));
  }
  return j.get<uint64_t>();
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const nlohmann::json& j,
                                            uint64_t data_bytes) {
  if (name.empty()) return Bad("empty tensor name");
  if (!j.is_object()) return BadTensor(name, "entry is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets") {
      return BadTensor(name, Msg("unexpected field '", it.key(), "'"));
    }
  }
  if (!j.contains("dtype") || !j["dtype"].is_string()) return BadTensor(name, "missing string field 'dtype'");
  if (!j.contains("shape") || !j["shape"].is_array()) return BadTensor(name, "missing array field 'shape'");
  if (!j.contains("data_offsets") || !j["data_offsets"].is_array() || j["data_offsets"].size() != 2) {
    return BadTensor(name, "'data_offsets' must be an array of two integers");
  }
  SafetensorsEntry e;
  e.name = name;
  absl::StatusOr<DType> dtype = ParseDType(j["dtype"].get<std::string>());
  if (!dtype.ok()) return BadTensor(name, std::string(dtype.status().message()));
  e.dtype = *dtype;
  for (const nlohmann::json& d : j["shape"]) {
    REFIT_ASSIGN_OR_RETURN(uint64_t v, ReadUnsigned(d, name, "shape"));
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return BadTensor(name, Msg("shape dimension ", v, " is too large"));
    }
    e.shape.push_back(static_cast<int64_t>(v));
  }
  REFIT_ASSIGN_OR_RETURN(e.begin, ReadUnsigned(j["data_offsets"][0], name, "data_offsets"));
  REFIT_ASSIGN_OR_RETURN(e.end, ReadUnsigned(j["data_offsets"][1], name, "data_offsets"));
  if (e.begin > e.end) {
    return BadTensor(name, Msg("data_offsets [", e.begin, ", ", e.end, "] are reversed"));
  }
  if (e.end > data_bytes) {
    return BadTensor(name, Msg("data_offsets [", e.begin, ", ", e.end,
                                        "] run past the data section of ", data_bytes, " bytes"));
  }
  absl::StatusOr<uint64_t> want = DenseBytes(e.dtype, e.shape);
  if (!want.ok()) return BadTensor(name, std::string(want.status().message()));
  if (*want != e.end - e.begin) {
    return BadTensor(name, Msg(DTypeName(e.dtype), ShapeString(e.shape), " needs ", *want,
                                        " bytes but data_offsets span ", e.end - e.begin));
  }
  return e;
}

// SAX handler recording the header's top-level keys in order (the first duplicate too) and the
// keys of __metadata__ in order (each once); builds no values.
struct HeaderKeys {
  using number_integer_t = nlohmann::json::number_integer_t;
  using number_unsigned_t = nlohmann::json::number_unsigned_t;
  using number_float_t = nlohmann::json::number_float_t;
  using string_t = nlohmann::json::string_t;
  using binary_t = nlohmann::json::binary_t;

  std::vector<std::string> top;
  std::vector<std::string> metadata;
  std::string duplicate;
  std::set<std::string> seen_top, seen_metadata;
  int depth = 0;
  bool in_metadata = false;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(number_integer_t) { return true; }
  bool number_unsigned(number_unsigned_t) { return true; }
  bool number_float(number_float_t, const string_t&) { return true; }
  bool string(string_t&) { return true; }
  bool binary(binary_t&) { return true; }
  bool start_object(std::size_t) {
    ++depth;
    return true;
  }
  bool end_object() {
    --depth;
    return true;
  }
  bool start_array(std::size_t) {
    ++depth;
    return true;
  }
  bool end_array() {
    --depth;
    return true;
  }
  bool key(string_t& k) {
    if (depth == 1) {
      in_metadata = k == kMetadataKey;
      if (seen_top.insert(k).second) {
        top.push_back(k);
      } else if (duplicate.empty()) {
        duplicate = k;
      }
    } else if (depth == 2 && in_metadata && seen_metadata.insert(k).second) {
      metadata.push_back(k);
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
};

}  // namespace

absl::StatusOr<SafetensorsView> SafetensorsView::Parse(std::span<const uint8_t> file,
                                                       const SafetensorsLimits& limits) {
  if (file.size() < 8) {
    return Bad(Msg("file is ", file.size(), " bytes, too short for the header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file[static_cast<size_t>(i)];
  if (header_len > limits.max_header_bytes) {
    return Bad(Msg("header length ", header_len, " exceeds the limit of ",
                            limits.max_header_bytes, " bytes"));
  }
  if (header_len > file.size() - 8) {
    return Bad(Msg("header length ", header_len, " runs past the end of the ",
                            file.size(), "-byte file"));
  }
  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  // The header's key order (of the tensors and of __metadata__) and its duplicate keys come from
  // a SAX pass; the values from a plain parse into a std::map-backed object. (An ordered_json
  // object searches its member vector on every insert, and nlohmann's callback parser scans the
  // parent object at every closing brace: both quadratic in the tensor count.)
  HeaderKeys keys;
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text, text + header_len);  // throws, naming the problem
    if (!nlohmann::json::sax_parse(text, text + header_len, &keys)) return Bad("header is not valid JSON");
  } catch (const nlohmann::json::exception& e) {
    return Bad(Msg("header is not valid JSON: ", e.what()));
  }
  const std::vector<std::string>& order_in_header = keys.top;
  const std::vector<std::string>& metadata_order = keys.metadata;
  const std::string& duplicate = keys.duplicate;
  if (!duplicate.empty()) return Bad(Msg("duplicate header key '", duplicate, "'"));
  if (!root.is_object()) return Bad("header is not a JSON object");

  SafetensorsView view;
  view.data_ = file.subspan(8 + header_len);
  const uint64_t data_bytes = view.data_.size();
  for (const std::string& key : order_in_header) {
    const nlohmann::json& value = root.at(key);
    if (key == kMetadataKey) {
      if (!value.is_object()) return Bad("__metadata__ is not a JSON object");
      for (const std::string& m : metadata_order) {
        const nlohmann::json& v = value.at(m);
        if (!v.is_string()) return Bad(Msg("__metadata__ value for '", m, "' is not a string"));
        view.metadata_.emplace_back(m, v.get<std::string>());
      }
      continue;
    }
    REFIT_ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(key, value, data_bytes));
    view.tensors_.push_back(std::move(e));
  }

  // The offsets must tile the data section: sorted by offset, each tensor starts where the
  // previous one ended and the last ends at the end of the file.
  std::vector<const SafetensorsEntry*> order;
  for (const SafetensorsEntry& e : view.tensors_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : order) {
    if (e->begin < pos) {
      return BadTensor(e->name, Msg("data_offsets [", e->begin, ", ", e->end,
                                             "] overlap tensor '", prev->name, "' [", prev->begin,
                                             ", ", prev->end, "]"));
    }
    if (e->begin > pos) {
      return BadTensor(e->name, Msg("data_offsets start at ", e->begin, " leaving a gap of ",
                                             e->begin - pos, " bytes before it"));
    }
    pos = e->end;
    prev = e;
  }
  if (pos != data_bytes) {
    return Bad(Msg("data section has ", data_bytes - pos,
                            " trailing bytes not covered by any tensor"));
  }
  return view;
}

const SafetensorsEntry* SafetensorsView::Find(std::string_view name) const {
  for (const SafetensorsEntry& e : tensors_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const UniqueFd owner(::open(path.c_str(), O_RDONLY | O_CLOEXEC));  // the mapping outlives it
  const int fd = owner.get();
  if (fd < 0) return absl::NotFoundError(Msg("cannot open '", path, "': ", std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    return absl::InternalError(Msg("cannot stat '", path, "': ", std::strerror(err)));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* addr = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      return absl::InternalError(Msg("cannot mmap '", path, "': ", std::strerror(err)));
    }
    addr = static_cast<const uint8_t*>(p);
  }
  return std::unique_ptr<MappedFile>(new MappedFile(addr, size));
}

MappedFile::~MappedFile() {
  if (addr_ != nullptr) ::munmap(const_cast<uint8_t*>(addr_), size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path,
                                                                       const SafetensorsLimits& limits) {
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> map, MappedFile::Open(path));
  absl::StatusOr<SafetensorsView> view = SafetensorsView::Parse(map->bytes(), limits);
  if (!view.ok()) {
    return absl::Status(view.status().code(), Msg(path, ": ", view.status().message()));
  }
  return std::unique_ptr<SafetensorsFile>(new SafetensorsFile(std::move(map), std::move(*view)));
}

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

absl::Status WriteAll(std::FILE* f, const void* data, size_t n, const std::string& path) {
  if (n > 0 && std::fwrite(data, 1, n, f) != n) {
    return absl::InternalError(Msg("write to '", path, "' failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WriteBody(const std::string& tmp, const std::string& header,
                       const std::vector<const SafetensorsWriteEntry*>& order,
                       const std::vector<uint64_t>& sizes) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
  if (!f) return absl::InternalError(Msg("cannot create '", tmp, "': ", std::strerror(errno)));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));
  REFIT_RETURN_IF_ERROR(WriteAll(f.get(), len, 8, tmp));
  REFIT_RETURN_IF_ERROR(WriteAll(f.get(), header.data(), header.size(), tmp));
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < order.size(); ++i) {
    const SafetensorsWriteEntry& e = *order[i];
    if (e.fill) {
      buf.assign(sizes[i], 0);
      absl::Status s = e.fill(std::span<uint8_t>(buf));
      if (!s.ok()) return s;
      REFIT_RETURN_IF_ERROR(WriteAll(f.get(), buf.data(), buf.size(), tmp));
    } else {
      REFIT_RETURN_IF_ERROR(WriteAll(f.get(), e.bytes.data(), e.bytes.size(), tmp));
    }
  }
  std::FILE* raw = f.release();
  if (std::fflush(raw) != 0 || std::fclose(raw) != 0) {
    return absl::InternalError(Msg("closing '", tmp, "' failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, std::span<const SafetensorsWriteEntry> entries,
                              const SafetensorsWriteOptions& options) {
  std::vector<const SafetensorsWriteEntry*> order;
  std::set<std::string_view> names;
  for (const SafetensorsWriteEntry& e : entries) {
    if (e.name.empty()) return Bad("cannot write a tensor with an empty name");
    if (e.name == kMetadataKey) return Bad("'__metadata__' is not a tensor name");
    if (!names.insert(e.name).second) return BadTensor(e.name, "duplicate tensor name");
    order.push_back(&e);
  }
  if (options.order == HeaderOrder::kSortedByName) {
    std::sort(order.begin(), order.end(),
              [](const SafetensorsWriteEntry* a, const SafetensorsWriteEntry* b) { return a->name < b->name; });
  }
  // The header object is written member by member, in order: building it as one ordered_json
  // object would search its member vector on every insert (quadratic in the tensor count). The
  // bytes are those ordered_json::dump() gives.
  std::string text = "{";
  auto member = [&text](std::string_view key, const Json& value) {
    if (text.size() > 1) text += ',';
    text += Json(std::string(key)).dump();
    text += ':';
    text += value.dump();
  };
  if (!options.metadata.empty()) {
    // A repeated key keeps its first place and its last value, as an ordered_json object would.
    std::map<std::string_view, size_t> place;
    std::vector<std::pair<std::string_view, std::string_view>> members;
    for (const auto& [k, v] : options.metadata) {
      auto [it, fresh] = place.emplace(k, members.size());
      if (fresh) {
        members.emplace_back(k, v);
      } else {
        members[it->second].second = v;
      }
    }
    std::string meta = "{";
    for (const auto& [k, v] : members) {
      if (meta.size() > 1) meta += ',';
      meta += Json(std::string(k)).dump();
      meta += ':';
      meta += Json(std::string(v)).dump();
    }
    meta += '}';
    text += Json(std::string(kMetadataKey)).dump();
    text += ':';
    text += meta;
  }
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const SafetensorsWriteEntry* e : order) {
    absl::StatusOr<uint64_t> bytes = DenseBytes(e->dtype, e->shape);
    if (!bytes.ok()) return BadTensor(e->name, std::string(bytes.status().message()));
    if (!e->fill && e->bytes.size() != *bytes) {
      return BadTensor(e->name, Msg(DTypeName(e->dtype), ShapeString(e->shape), " needs ",
                                             *bytes, " bytes, got ", e->bytes.size()));
    }
    Json j = Json::object();
    j["dtype"] = std::string(DTypeName(e->dtype));
    j["shape"] = e->shape;
    j["data_offsets"] = {offset, offset + *bytes};
    member(e->name, j);
    sizes.push_back(*bytes);
    offset += *bytes;
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  absl::Status s = WriteBody(tmp, text, order, sizes);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::InternalError(Msg("cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno)));
  }
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

}  // namespace refit::formats
