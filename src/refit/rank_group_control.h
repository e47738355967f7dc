// The pause/resume of an engine of several ranks as one EngineControl: Pause pauses every rank
// at once and returns when all have paused; Resume resumes every rank at once with the same
// version. A rank that fails is named in the error and remembered (failed_ranks), so the node
// marks that rank dirty. If some ranks paused and another did not, the paused ones are resumed
// with the version they hold (nothing was written), so no rank is left paused by a refused window.
//
// Threading: Pause and Resume from the commit's worker thread (each rank's call on a thread of its
// own); Responsive and failed_ranks from any thread.
#ifndef REFIT_REFIT_RANK_GROUP_CONTROL_H_
#define REFIT_REFIT_RANK_GROUP_CONTROL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "refit/engine_control.h"

namespace refit {

class RankGroupControl final : public EngineControl {
 public:
  struct Rank {
    std::string label;
    std::shared_ptr<EngineControl> control;
  };
  // `version`, `tag`: what every rank holds now (a refused pause resumes the paused ranks with it).
  RankGroupControl(std::vector<Rank> ranks, uint64_t version, std::string tag);

  absl::Status Pause(absl::Duration timeout) override;
  absl::Status Resume(uint64_t version, const std::string& tag, absl::Duration timeout) override;
  bool Responsive() const override;

  // Indices of the ranks whose last pause or resume failed.
  std::vector<size_t> failed_ranks() const;

 private:
  // Runs `call` for every rank (index `r` in `ranks`) at once; the first error names the ranks.
  template <typename Call>
  absl::Status Each(const std::vector<size_t>& ranks, const char* what, Call call, std::vector<size_t>* ok);

  std::vector<Rank> ranks_;
  mutable absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_);
  std::string tag_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace refit

#endif  // REFIT_REFIT_RANK_GROUP_CONTROL_H_
