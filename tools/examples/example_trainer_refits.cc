// The example trainer's demo refits: connecting to the daemons (one, a fan-out, an engine group),
// then for each refit its weights made, begun (or joined, by --ranks), pushed (whole, in slices,
// in place; --fault's injections), committed or staged (--group: committed on every member), and
// the engine's bytes read back and checked. One JSON line per refit.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/trainer_client.h"
#if REFIT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#include "common/trace.h"
#include "example_trainer_internal.h"

namespace refit::examples {

int RunRefits(TrainerFlags flags, const spec::ModelSpec& spec) {
  if (flags.ranks > 1 && (flags.session_file.empty() || flags.rank < 0 || flags.rank >= flags.ranks ||
                          flags.refits != 1 || (flags.slices > 1 && flags.slices != flags.ranks))) {
    return Fail(
        "--ranks needs --session-file, 0 <= --rank < --ranks, --refits 1, and --slices equal to --ranks if given");
  }
  if (flags.gpu >= 0) {
#if REFIT_HAVE_CUDA
    if (cudaSetDevice(flags.gpu) != cudaSuccess) return Fail(absl::StrCat("cannot use GPU ", flags.gpu));
#else
    return Fail("--gpu needs a build with CUDA");
#endif
  }
  if (flags.addresses.empty()) flags.addresses.push_back(flags.address);
  flags.fanout = flags.fanout || flags.addresses.size() > 1 || flags.group;
  if (flags.group) {
    flags.stage_only = true;
    if (flags.tag.empty()) flags.tag = "group";
  }
  if (flags.fanout && flags.ranks > 1) return Fail("--ranks does not combine with several --address flags");
  // The daemons' clients: one TrainerClient, or a FanoutClient holding one per daemon.
  std::unique_ptr<client::TrainerClient> single;
  std::unique_ptr<client::FanoutClient> fan;
  std::vector<client::TrainerClient*> daemons;
  if (flags.fanout) {
    absl::StatusOr<std::unique_ptr<client::FanoutClient>> c = client::FanoutClient::Connect(flags.addresses);
    if (!c.ok()) return Fail(c.status().message());
    fan = std::move(*c);
    for (size_t d = 0; d < fan->size(); ++d) daemons.push_back(&fan->daemon(d));
  } else {
    absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(flags.address);
    if (!c.ok()) return Fail(c.status().message());
    single = std::move(*c);
    daemons.push_back(single.get());
  }
  client::TrainerClient* const control = daemons.front();
  absl::StatusOr<client::DaemonStatus> status = control->Status();
  if (!status.ok()) return Fail(status.status().message());

  int ctl_fd = -1, ack_fd = -1;  // --sleep-wake: our orders to the engine, its answers
  if (!flags.sleep_wake.empty()) {
    ctl_fd = open((flags.sleep_wake + ".ctl").c_str(), O_RDWR | O_CLOEXEC);
    ack_fd = open((flags.sleep_wake + ".ack").c_str(), O_RDWR | O_CLOEXEC);
    if (ctl_fd < 0 || ack_fd < 0) {
      return Fail(absl::StrCat("cannot open the FIFOs ", flags.sleep_wake, ".ctl and .ack: ", std::strerror(errno)));
    }
  }
  // Sends `order` to the engine and waits for its answer `ack`.
  auto order_engine = [&](char order, char ack) -> absl::Status {
    char got = 0;
    pollfd p{ack_fd, POLLIN, 0};
    if (write(ctl_fd, &order, 1) != 1 || poll(&p, 1, 120000) != 1 || read(ack_fd, &got, 1) != 1 || got != ack) {
      return absl::DeadlineExceededError(absl::StrCat("the engine did not answer '", std::string(1, order), "' with '",
                                                      std::string(1, ack), "' within 120 s (", flags.sleep_wake,
                                                      ".ack)"));
    }
    return absl::OkStatus();
  };
  int unexpected = 0;
#if REFIT_HAVE_CUDA
  DeviceWeights device;  // --gpu: the weights on the GPU, kept across refits
#endif
  for (int refit = 0; refit < flags.refits; ++refit) {
    if (ctl_fd >= 0 && refit > 0) {  // the rollout done, the engine sleeps through the step
      if (absl::Status s = order_engine('s', 'a'); !s.ok()) return Fail(s.message());
    }
    RefitWeights weights;
    if (absl::Status st = MakeRefitWeights(flags, spec, status->model, refit, &weights); !st.ok()) {
      return Fail(st.message());
    }
    const std::map<std::string, uint64_t>& expected = weights.expected;
    const std::vector<ConvertedTensor>& to_send = weights.to_send;
    const Manifest& manifest = weights.manifest;
    // With --gpu the weights live on the GPU, as a trainer's do.
    std::vector<const void*> sources;
    for (const ConvertedTensor& c : to_send) sources.push_back(c.bytes.data());
#if REFIT_HAVE_CUDA
    if (flags.gpu >= 0) {
      if (absl::Status st = PlaceOnGpu(flags, to_send, &device, &sources); !st.ok()) return Fail(st.message());
    }
#endif
    if (ctl_fd >= 0 && refit > 0) {  // the step done, the engine wakes; the refit begins once it is awake
      if (absl::Status s = order_engine('w', 'w'); !s.ok()) return Fail(s.message());
    }
    const absl::Time begun = absl::Now();
    // Several ranks: rank 0 begins the session and publishes its id in --session-file; the other
    // ranks join it, push their share and detach, each then touching <session-file>.done.<rank>.
    absl::StatusOr<std::unique_ptr<client::RefitSession>> session = absl::UnknownError("not begun");
    if (flags.rank == 0) {
      session = flags.fanout ? fan->Begin(manifest) : control->Begin(manifest);
      if (session.ok() && flags.ranks > 1) {
        std::string tmp = flags.session_file + ".tmp";
        std::FILE* f = std::fopen(tmp.c_str(), "w");
        if (f == nullptr) return Fail(absl::StrCat("cannot write ", tmp));
        std::fprintf(f, "%llu\n", static_cast<unsigned long long>((*session)->id()));
        std::fclose(f);
        std::rename(tmp.c_str(), flags.session_file.c_str());
      }
    } else {
      unsigned long long id = 0;
      for (int tries = 0; tries < 6000 && id == 0; ++tries) {
        if (std::FILE* f = std::fopen(flags.session_file.c_str(), "r")) {
          if (std::fscanf(f, "%llu", &id) != 1) id = 0;
          std::fclose(f);
        }
        if (id == 0) usleep(10000);
      }
      if (id == 0) return Fail(absl::StrCat("no session id in ", flags.session_file));
      session = control->Join(id);
    }
    if (!session.ok()) return Fail(session.status().message());
    (*session)->MeasureAmax(flags.measure_amax);
    const absl::Time begin_done = absl::Now();
    absl::Time ready = begin_done;  // the weights ready to push (--begin-ahead-ms: that long after Begin)
    if (flags.begin_ahead_ms > 0) {
      absl::SleepFor(absl::Milliseconds(flags.begin_ahead_ms) - (begin_done - begun));
      ready = absl::Now();
      TracePoint("trainer.weights_ready");
    }
    if (flags.fault == "silent") {
      std::fprintf(stderr, "example_trainer: sending nothing after begin (fault injection)\n");
      pause();
    }
    if (flags.fault == "bit-flip") {
      // One bit of the first bucket flips on the wire, after its checksum was announced.
      (*session)->SetWireTamper([](uint32_t seq, std::vector<uint8_t>& bytes) {
        if (seq == 0 && !bytes.empty()) bytes[bytes.size() / 2] ^= 0x10;
      });
    } else if (flags.fault == "garbage") {
      // The data plane carries bytes unrelated to the announced bucket.
      (*session)->SetWireTamper([](uint32_t seq, std::vector<uint8_t>& bytes) {
        uint64_t x = 0x9e3779b97f4a7c15ull + seq;
        for (uint8_t& b : bytes) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          b = static_cast<uint8_t>(x);
        }
      });
    }
    absl::Status pushed;
    bool dropped_slice = false;
    // --slices N: every matrix goes as N slices, as tensor-parallel ranks would push their shards
    // (alternately along dimension 0 and 1; only 0 for device tensors), last slice first.
    auto push = [&](size_t i) -> absl::Status {
      const ConvertedTensor& c = to_send[i];
      if (flags.slices <= 1 || c.shape.size() != 2) {
        // Whole tensors are shared out round-robin (with slices, rank 0 sends the vectors).
        const bool mine =
            flags.ranks <= 1 || (flags.slices > 1 ? flags.rank == 0 : static_cast<int>(i % flags.ranks) == flags.rank);
        if (!mine) return absl::OkStatus();
        return flags.in_place ? (*session)->PushInPlace({c.name, c.dtype, c.shape, sources[i]})
                              : (*session)->Push({c.name, c.dtype, c.shape, sources[i]});
      }
      const size_t dim = flags.gpu >= 0 ? 0 : i % 2;
      const int64_t rows = c.shape[dim];
      const int parts = static_cast<int>(std::min<int64_t>(flags.slices, rows));
      const uint64_t esize = DTypeSize(c.dtype);
      for (int p = parts; p-- > 0;) {
        if (flags.ranks > 1 && p != flags.rank) continue;  // each rank pushes its own shard
        const int64_t start = rows * p / parts, end = rows * (p + 1) / parts;
        if (flags.fault == "drop-slice" && !dropped_slice && p == 1) {
          dropped_slice = true;
          continue;
        }
        Shape shape = c.shape;
        shape[dim] = end - start;
        TensorSlice slice{static_cast<int32_t>(dim), static_cast<uint64_t>(start), c.shape};
        std::vector<uint8_t> gathered;
        const uint8_t* from = static_cast<const uint8_t*>(sources[i]);
        if (dim == 0) {
          from += static_cast<uint64_t>(start) * static_cast<uint64_t>(c.shape[1]) * esize;
        } else {
          const uint64_t width = static_cast<uint64_t>(end - start) * esize;
          for (int64_t r = 0; r < c.shape[0]; ++r) {
            const uint8_t* row =
                from +
                (static_cast<uint64_t>(r) * static_cast<uint64_t>(c.shape[1]) + static_cast<uint64_t>(start)) * esize;
            gathered.insert(gathered.end(), row, row + width);
          }
          from = gathered.data();
        }
        if (absl::Status st = (*session)->Push({c.name, c.dtype, shape, from, slice}); !st.ok()) return st;
      }
      return absl::OkStatus();
    };
    // --fault withhold: the manifest names every tensor, the last is never sent (refused at commit).
    const size_t send_count = flags.fault == "withhold" && !to_send.empty() ? to_send.size() - 1 : to_send.size();
    for (size_t i = 0; i < send_count && pushed.ok(); ++i) {
      pushed = push(i);
      if (flags.fault == "die-mid-bucket" && i == to_send.size() / 2) {
        (void)(*session)->Flush();
        // Sends leave in the background: a moment for refitd to take what was sent, so that the
        // death comes mid-refit (refitd converting, or waiting for the rest), not before the
        // first bucket reached it.
        usleep(20000);
        std::fprintf(stderr, "example_trainer: dying mid-refit (fault injection)\n");
        _exit(9);
      }
      if (flags.fault == "stall" && i == to_send.size() / 2) {
        (void)(*session)->Flush();
        std::fprintf(stderr, "example_trainer: stalling (fault injection)\n");
        pause();
      }
    }
    if (flags.rank > 0) {
      absl::Status st = pushed.ok() ? (*session)->Detach() : pushed;
      if (!st.ok()) return Fail(st.message());
      std::string done = absl::StrCat(flags.session_file, ".done.", flags.rank);
      if (std::FILE* f = std::fopen(done.c_str(), "w")) std::fclose(f);
      std::printf("{\"rank\":%d,\"outcome\":\"detached\"}\n", flags.rank);
      std::fflush(stdout);
      return 0;
    }
    if (flags.ranks > 1) {
      for (int r = 1; r < flags.ranks; ++r) {
        std::string done = absl::StrCat(flags.session_file, ".done.", r);
        for (int tries = 0; tries < 12000 && access(done.c_str(), F_OK) != 0; ++tries) {
          usleep(10000);
          if (tries % 10 != 9) continue;
          // Stop waiting once the session ended (e.g. a joined rank died): the commit then says why.
          absl::StatusOr<client::DaemonStatus> now = control->Status();
          if (now.ok() && now->active_session != (*session)->id()) break;
        }
      }
    }
    if (flags.fault == "abort") {
      absl::Status st = (*session)->Abort("fault injection: trainer abort");
      RefitReport r;
      r.outcome = Outcome::kAborted;
      std::printf("%s\n", Json(r, refit, false, std::string(st.message()), 0, st.code()).c_str());
      continue;
    }
    const absl::Time push_done = absl::Now();
    absl::StatusOr<RefitReport> report = pushed.ok() ? (*session)->Commit() : absl::StatusOr<RefitReport>(pushed);
    const double push_commit_ms = absl::ToDoubleMilliseconds(absl::Now() - begun);
    // The trainer's own timeline: Begin (manifest sent, refitd planned it), the pushes (packing
    // and every bucket but the last sent), Commit (the last bucket, then refitd's commit).
    const std::string trainer_times =
        absl::StrCat(",\"trainer_begin_ms\":", absl::ToDoubleMilliseconds(begin_done - begun),
                     ",\"trainer_push_ms\":", absl::ToDoubleMilliseconds(push_done - begin_done),
                     ",\"trainer_commit_ms\":", absl::ToDoubleMilliseconds(absl::Now() - push_done),
                     ",\"pushed_in_place_bytes\":", (*session)->pushed_in_place_bytes(),
                     ",\"ready_commit_ms\":", absl::ToDoubleMilliseconds(absl::Now() - ready));
    if (flags.group) {
      // Prepared on every member (staged), or not: then the group version is aborted everywhere.
      std::string line;
      bool ok = false;
      if (!report.ok() || report->outcome != Outcome::kStaged) {
        const std::string why = report.ok() ? report->reason : std::string(report.status().message());
        absl::Status dropped =
            fan->AbortGroup(manifest.tag, absl::StrCat("not prepared everywhere: ", why), flags.group_timeout_ms);
        line = absl::StrCat("{\"refit\":", refit, ",\"tag\":\"", manifest.tag,
                            "\",\"group\":\"aborted\",\"phase\":\"prepare\",\"error\":\"",
                            JsonEscape(why + (dropped.ok() ? "" : absl::StrCat("; ", dropped.message()))), "\"}");
        ok = flags.fault != "none";
      } else {
        absl::StatusOr<client::GroupCommitResult> g =
            fan->CommitGroup(manifest.tag, flags.group_deadline_ms, flags.group_timeout_ms, [&] {
              if (flags.group_fault == "exit-after-copy") {
                std::printf("{\"refit\":%d,\"tag\":\"%s\",\"group\":\"copied\",\"exiting\":true}\n", refit,
                            manifest.tag.c_str());
                std::fflush(stdout);
                _exit(5);
              }
            });
        if (!g.ok()) return Fail(g.status().message());
        line = absl::StrCat("{\"refit\":", refit, ",\"tag\":\"", manifest.tag, "\",\"group\":\"", g->outcome,
                            "\",\"phase\":\"commit\",\"error\":\"", JsonEscape(g->error), "\"}");
        ok = g->outcome == "committed" || flags.fault != "none";
      }
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      if (!ok) ++unexpected;
      continue;
    }
    if (!report.ok()) {
      RefitReport r;
      r.outcome = Outcome::kRefused;
      std::printf("%s\n",
                  Json(r, refit, false, std::string(report.status().message()), 0, report.status().code()).c_str());
      std::fflush(stdout);
      if (flags.fault == "none") ++unexpected;
      continue;
    }
    if (report->outcome == Outcome::kStaged) {
      // Held in refitd's staging: the engine is unchanged until `refitctl commit TAG`.
      std::string line = Json(*report, refit, false, "", push_commit_ms);
      line.insert(line.size() - 1, trainer_times);
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      if (flags.fault != "none") ++unexpected;
      continue;
    }
    if (!flags.verify) {
      std::string line = Json(*report, refit, false, "not verified", push_commit_ms);
      line.insert(line.size() - 1, trainer_times);
      if (daemons.size() > 1) {
        // No offline conversion to compare with; every engine must at least hold the same bytes.
        bool equal = true;
        std::vector<client::ParamChecksum> first;
        for (client::TrainerClient* d : daemons) {
          absl::StatusOr<std::pair<uint64_t, std::vector<client::ParamChecksum>>> sums = d->Checksums();
          if (!sums.ok()) return Fail(sums.status().message());
          if (d == control) {
            first = sums->second;
            continue;
          }
          equal = equal && sums->second.size() == first.size();
          for (size_t k = 0; equal && k < first.size(); ++k) {
            equal = sums->second[k].name == first[k].name && sums->second[k].checksum == first[k].checksum;
          }
        }
        line.insert(line.size() - 1,
                    absl::StrCat(",\"daemons\":", daemons.size(), ",\"engines_equal\":", equal ? "true" : "false"));
        if (!equal) ++unexpected;
      }
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      continue;
    }
    // Read every engine's bytes back through its refitd and compare with the offline conversion.
    bool match = true;
    for (client::TrainerClient* d : daemons) {
      absl::StatusOr<std::pair<uint64_t, std::vector<client::ParamChecksum>>> sums = d->Checksums();
      if (!sums.ok()) return Fail(sums.status().message());
      match = match && sums->second.size() == expected.size() && (d != control || sums->first == report->version);
      for (const client::ParamChecksum& p : sums->second) {
        auto it = expected.find(p.name);
        if (it == expected.end() || it->second != p.checksum) match = false;
      }
    }
    std::string line = Json(*report, refit, match, "", push_commit_ms);
    line.insert(line.size() - 1, trainer_times);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (flags.fault != "none" || !match) ++unexpected;
  }
  return unexpected == 0 ? 0 : 4;
}

}  // namespace refit::examples
