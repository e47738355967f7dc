#include "server/manifest_cache.h"

#include <string>
#include <utility>

#include "common/checksum.h"

namespace refit::server {
namespace {

// Bytes hashed into a key: texts NUL-terminated, integers as their 8 bytes.
struct KeyBytes {
  std::string bytes;
  void Text(capnp::Text::Reader t) {
    bytes.append(t.cStr(), t.size());
    bytes.push_back('\0');
  }
  void Int(int64_t v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
  uint64_t Hash() const { return Checksum64(bytes.data(), bytes.size()); }
};

}  // namespace

ManifestTensors HashTensors(capnp::List<proto::TensorDesc>::Reader tensors) {
  ManifestTensors out;
  KeyBytes key;
  key.bytes.reserve(64 * tensors.size() + 8);
  key.Int(static_cast<int64_t>(tensors.size()));
  for (proto::TensorDesc::Reader t : tensors) {
    key.Text(t.getName());
    key.Text(t.getDtype());
    key.Int(static_cast<int64_t>(t.getShape().size()));
    for (int64_t d : t.getShape()) key.Int(d);
    key.Int(static_cast<int64_t>(t.getOffset()));
    key.Int(static_cast<int64_t>(t.getNbytes()));
    key.Int(t.getSliceDim());
    key.Int(static_cast<int64_t>(t.getSliceStart()));
    key.Int(static_cast<int64_t>(t.getFullShape().size()));
    for (int64_t d : t.getFullShape()) key.Int(d);
    if (t.getHasAmax()) out.keepable = false;
  }
  out.key = key.Hash();
  if (out.key == 0) out.keepable = false;  // 0 names no list
  return out;
}

// What a manifest's placement (staging: direct) depends on, hashed: its tensor list (`tensors`,
// HashTensors), the model and the kind of refit (not the tag or deadline).
uint64_t PlacementKey(proto::Manifest::Reader m, uint64_t tensors) {
  KeyBytes key;
  key.Text(m.getModel());
  key.Text(m.getWireFormat());
  key.Int((m.getPartial() ? 1 : 0) | (m.getStageOnly() ? 2 : 0));
  key.Int(static_cast<int64_t>(tensors));
  return key.Hash();
}

// A begin that names its tensor list by key (Daemon.begin) instead of sending it.
bool BeginsByKey(proto::Daemon::BeginParams::Reader params) {
  return params.getManifestKey() != 0 && params.getManifest().getTensors().size() == 0;
}

std::shared_ptr<const std::vector<TensorDesc>> ManifestCache::KeptTensors(uint64_t key) {
  for (auto it = kept_manifests_.begin(); it != kept_manifests_.end(); ++it) {
    if (it->key != key) continue;
    KeptManifest kept = std::move(*it);
    kept_manifests_.erase(it);
    kept_manifests_.push_back(std::move(kept));
    return kept_manifests_.back().tensors;
  }
  return nullptr;
}

void ManifestCache::KeepTensors(uint64_t key, std::shared_ptr<const std::vector<TensorDesc>> tensors) {
  for (auto it = kept_manifests_.begin(); it != kept_manifests_.end(); ++it) {
    if (it->key == key) {
      kept_manifests_.erase(it);
      break;
    }
  }
  kept_manifests_.push_back({key, std::move(tensors)});
  if (kept_manifests_.size() > kKeptManifests) kept_manifests_.pop_front();
}

}  // namespace refit::server
