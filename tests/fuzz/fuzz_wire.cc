// Fuzz target: control-plane decoding as refitd does it. The input is a Cap'n Proto message
// (flat array, one segment) read with refitd's ReaderOptions; its root is decoded as a Manifest
// and as a BucketHeader (wire::FromWire), and every decoded tensor's size is recomputed with the
// overflow-checked DenseBytes, as Session::CheckHeader does.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "capnp/serialize.h"
#include "common/dtype.h"
#include "kj/exception.h"
#include "proto/wire.h"

namespace {

void CheckSizes(const std::vector<refit::TensorDesc>& tensors) {
  for (const refit::TensorDesc& t : tensors) (void)refit::DenseBytes(t.dtype, t.shape);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8 || size > (1u << 20)) return 0;
  // Word-aligned copy: Cap'n Proto reads 8-byte words.
  std::vector<capnp::word> words(size / sizeof(capnp::word));
  std::memcpy(words.data(), data, words.size() * sizeof(capnp::word));
  capnp::ReaderOptions options;
  options.traversalLimitInWords = 1 << 16;
  options.nestingLimit = 16;
  kj::runCatchingExceptions([&]() {
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.data(), words.size()), options);
    absl::StatusOr<refit::Manifest> m = refit::wire::FromWire(reader.getRoot<refit::proto::Manifest>());
    if (m.ok()) CheckSizes(m->tensors);
    absl::StatusOr<refit::BucketHeader> h = refit::wire::FromWire(reader.getRoot<refit::proto::BucketHeader>());
    if (h.ok()) CheckSizes(h->tensors);
  });
  return 0;
}
