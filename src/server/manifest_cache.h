// Begins by manifest key (Daemon.begin): a manifest's tensor list hashed over every field it
// carries, the placement key staging: direct's early pause goes by, and the last kKeptManifests
// lists refitd keeps so that a later begin may name one by key instead of sending it. Several, so
// that trainers of different lists (and a list sent again after another) keep going by key.
//
// Threading: event loop thread only.
#ifndef REFIT_SERVER_MANIFEST_CACHE_H_
#define REFIT_SERVER_MANIFEST_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "proto/refit.capnp.h"
#include "refit/types.h"

namespace refit::server {

// A manifest's tensor list, hashed (every field a manifest's TensorDesc carries), and whether
// refitd keeps it for begins by key (no supplied amax: that changes each refit).
struct ManifestTensors {
  uint64_t key = 0;
  bool keepable = true;
};

ManifestTensors HashTensors(capnp::List<proto::TensorDesc>::Reader tensors);

// What a manifest's placement (staging: direct) depends on, hashed: its tensor list (`tensors`,
// HashTensors), the model and the kind of refit (not the tag or deadline).
uint64_t PlacementKey(proto::Manifest::Reader m, uint64_t tensors);

// A begin that names its tensor list by key (Daemon.begin) instead of sending it.
bool BeginsByKey(proto::Daemon::BeginParams::Reader params);

// The last kKeptManifests tensor lists begins sent whole (most recent last), under their keys
// (ManifestTensors).
class ManifestCache {
 public:
  static constexpr size_t kKeptManifests = 8;
  // The kept list of `key` (made the most recent), or null.
  std::shared_ptr<const std::vector<TensorDesc>> KeptTensors(uint64_t key);
  void KeepTensors(uint64_t key, std::shared_ptr<const std::vector<TensorDesc>> tensors);

 private:
  struct KeptManifest {
    uint64_t key = 0;
    std::shared_ptr<const std::vector<TensorDesc>> tensors;
  };
  std::deque<KeptManifest> kept_manifests_;
};

}  // namespace refit::server

#endif  // REFIT_SERVER_MANIFEST_CACHE_H_
