// Lockstep: the forward steps of an engine whose ranks run in separate processes (and, in an
// engine group, are served by separate refitd daemons), modelled on the host. A real TP/EP
// engine's collectives keep its ranks in step: no rank runs step n+1 before every rank ran step n,
// and a rank paused by its refitd stalls them all. Here the ranks meet at a shared-memory barrier
// (a file of one round counter per rank, one count of steps run per rank, then two flag bytes
// per rank): in round k each rank publishes whether it has a pause pending or is paused, then
// waits for every rank to reach k. A round in which any rank's flag is set runs no step on any rank (the step boundary
// where a pause takes effect); otherwise every rank runs the round's step with the weights it holds and logs "<step>
// <tag>" to its steps file. Step n is the same forward step on every rank, so a step that mixed versions shows as two
// tags for one n (tests/integration/faults/group_lockstep.py).
//
// A rank whose process starts again resumes its predecessor's round and step numbering.
//
// Threading: Round is called by the engine's serving loop only.
#ifndef REFIT_TOOLS_EXAMPLES_LOCKSTEP_H_
#define REFIT_TOOLS_EXAMPLES_LOCKSTEP_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

namespace refit::examples {

class Lockstep {
 public:
  ~Lockstep() {
    if (map_ != nullptr) munmap(map_, bytes_);
    if (steps_ != nullptr) std::fclose(steps_);
  }

  // The barrier file (created by the test, at least Bytes(size) long), this rank's index and the
  // number of ranks; `steps_path` the log of the steps this rank ran.
  bool Open(const std::string& path, int rank, int size, const std::string& steps_path) {
    rank_ = rank;
    size_ = size;
    bytes_ = Bytes(size);
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return false;
    void* m = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return false;
    map_ = static_cast<uint8_t*>(m);
    // A rank process started again (its engine restarted) goes on where the one before it left:
    // from the round it last published, and at the step after the last one any rank ran (the
    // one before may have died between a round that ran a step and its log line; the others
    // cannot have run a step past it, since every step waits for every rank).
    round_ = Counter(rank_).load(std::memory_order_acquire);
    for (int j = 0; j < size_; ++j) step_ = std::max(step_, StepsRun(j).load(std::memory_order_acquire));
    steps_ = std::fopen(steps_path.c_str(), "a");
    return steps_ != nullptr;
  }
  static size_t Bytes(int size) { return static_cast<size_t>(size) * 18; }

  // One round: `flag` (a pause pending or held) published, every rank met. Returns true when the
  // round runs a step (no rank flagged); false when it does not, or when `stop` was set while
  // waiting.
  bool Round(bool flag, const std::atomic<bool>& stop) {
    ++round_;
    FlagAt(rank_, round_) = flag ? 1 : 0;
    Counter(rank_).store(round_, std::memory_order_release);
    for (int j = 0; j < size_; ++j) {
      while (Counter(j).load(std::memory_order_acquire) < round_) {
        if (stop.load()) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    for (int j = 0; j < size_; ++j) {
      if (FlagAt(j, round_) != 0) return false;
    }
    return true;
  }
  // Logs the step this round ran with the weights of `tag`.
  void Step(const std::string& tag) {
    std::fprintf(steps_, "%llu %s\n", static_cast<unsigned long long>(step_++), tag.empty() ? "-" : tag.c_str());
    std::fflush(steps_);
    StepsRun(rank_).store(step_, std::memory_order_release);
  }

 private:
  std::atomic<uint64_t>& Counter(int j) { return *reinterpret_cast<std::atomic<uint64_t>*>(map_ + 8 * j); }
  // The steps rank j ran (its next step's number).
  std::atomic<uint64_t>& StepsRun(int j) { return *reinterpret_cast<std::atomic<uint64_t>*>(map_ + 8 * size_ + 8 * j); }
  volatile uint8_t& FlagAt(int j, uint64_t round) {
    return *reinterpret_cast<volatile uint8_t*>(map_ + 16 * size_ + 2 * j + round % 2);
  }

  int rank_ = 0, size_ = 1;
  size_t bytes_ = 0;
  uint8_t* map_ = nullptr;
  std::FILE* steps_ = nullptr;
  uint64_t round_ = 0, step_ = 0;
};

}  // namespace refit::examples

#endif  // REFIT_TOOLS_EXAMPLES_LOCKSTEP_H_
