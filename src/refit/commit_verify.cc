#include "refit/commit_verify.h"

#include "absl/strings/str_cat.h"
#include "common/checksum.h"

namespace refit {

// The checksum of the staged bytes each write copies, where they are (host or GPU).
absl::StatusOr<std::vector<uint64_t>> StagedChecksums(const Planner& planner, const PreparedCommit& prepared,
                                                      storage::Memory& memory) {
  std::vector<uint64_t> sums;
  sums.reserve(prepared.writes.size());
  for (const PreparedCommit::Write& w : prepared.writes) {
    if (w.offset != 0 || w.bytes != planner.params()[w.index].nbytes) {
      return absl::InternalError(absl::StrCat("verify_after_commit: engine parameter '", planner.params()[w.index].name,
                                              "' is written piece by piece (PrepareOptions::pieces_in_place)"));
    }
    absl::StatusOr<uint64_t> sum = memory.Checksum(w.data, w.bytes);
    if (!sum.ok()) return sum.status();
    sums.push_back(*sum);
  }
  return sums;
}

// A kept version's checksum: ParallelChecksum64 of each staged tensor, chained with its name by
// Checksum64, in name order.
absl::StatusOr<uint64_t> StagingChecksum(const Staging& staging) {
  uint64_t sum = 0;
  for (const std::string& key : staging.Keys()) {
    const StagedTensor* t = staging.Get(key);
    if (t == nullptr) continue;
    absl::StatusOr<uint64_t> part = staging.pool().memory().Checksum(t->data, t->nbytes);
    if (!part.ok()) return part.status();
    sum = Checksum64(key.data(), key.size(), sum);
    sum = Checksum64(&*part, sizeof(uint64_t), sum);
  }
  return sum;
}

// The names of the written parameters whose engine bytes do not match `expected`.
absl::StatusOr<std::vector<std::string>> VerifyWrites(const Planner& planner, const PreparedCommit& prepared,
                                                      const std::vector<uint64_t>& expected,
                                                      const storage::EngineStorage& storage) {
  std::vector<std::string> mismatched;
  for (size_t i = 0; i < prepared.writes.size(); ++i) {
    absl::StatusOr<uint64_t> sum = storage.Checksum(prepared.writes[i].index);
    if (!sum.ok()) return sum.status();
    if (*sum != expected[i]) mismatched.push_back(planner.params()[prepared.writes[i].index].name);
  }
  return mismatched;
}

// The corrupt_copy failpoint: flips one bit of the first written parameter's first byte in the
// engine's storage.
absl::Status CorruptOneByte(const PreparedCommit& prepared, storage::EngineStorage& storage) {
  for (const PreparedCommit::Write& w : prepared.writes) {
    const uint64_t nbytes = storage.params()[w.index].nbytes;
    if (nbytes == 0) continue;
    std::vector<uint8_t> bytes(nbytes);
    if (absl::Status st = storage.ReadToHost(w.index, bytes.data()); !st.ok()) return st;
    bytes[0] ^= 0x01;
    if (absl::Status st = storage.WriteFromHost(w.index, bytes.data()); !st.ok()) return st;
    return storage.Flush();
  }
  return absl::OkStatus();
}

}  // namespace refit
