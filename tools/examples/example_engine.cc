// An example inference engine on the host path: holds the demo model's parameters (in the
// spec's checkpoint format) in POSIX shared memory, registers them with refitd, and "serves":
// each request reads every parameter and checksums it. Pause waits for in-flight requests;
// resume publishes the new version. It prints one JSON line per event on stdout:
//   {"event":"registered",...}  {"event":"resumed","version":V,"checksum":"..."}
//   {"event":"exit","requests":R,"mixed":M,"versions":[...]}
// `mixed` counts requests that saw bytes that are neither the old nor the new version of any
// parameter set (a checksum that differs between two requests of the same version): it must be 0.
//
//   example_engine [--address unix:/run/refitd/refitd.sock] [--spec FILE] [--shm NAME] [--gpu DEVICE [--vmm]]
//                  [--idle] [--reconnect] [--pause-ms MS] [shape flags]
// --pause-ms MS makes each pause take MS ms, printing {"event":"pausing"} when it starts.
// --lockstep FILE --lockstep-rank R --lockstep-size N --steps FILE: the engine is rank R of N
// rank processes (possibly served by several refitd daemons: an engine group) that run forward
// steps in lockstep over the shared-memory barrier FILE (lockstep.h), logging each step's tag to
// the steps FILE; a pause takes effect at a round boundary where no rank steps.
// --reconnect keeps serving when refitd goes away and registers again when it is back (a dirty
// engine, one that lost refitd inside a commit window, stays paused until a full refit lands).
// --gpu keeps the parameters in GPU memory (one cudaMalloc, exported by CUDA IPC) instead of shm;
// requests then copy every parameter to the host to checksum it. --vmm allocates that memory as
// CUDA virtual memory (cuMemCreate with a POSIX descriptor handle, mapped with cuMemMap), as
// vLLM's sleep mode and SGLang's memory saver do, and registers the parameters in place (the
// agent exports the allocation's descriptor; refitd imports and maps it).
// --sleep-wake PATH (with --gpu --vmm) is the engine side of the colocated loop, driven by a
// trainer started with --sleep-wake PATH over two FIFOs the caller made, PATH.ctl (orders) and
// PATH.ack (answers): at 's' the engine ends its rollout (serves one request of the version it
// holds), sleeps (Sleep, then its weights' memory unmapped and given back, printing
// {"event":"asleep","freed_bytes":B,...}) and answers 'a'; at 'w' it maps new memory at the same
// addresses, wakes (Wake), prints {"event":"awake",...} and answers 'w'. Between a wake and the
// next resume it serves nothing (its memory holds no weights).
//   example_engine --checkpoint DIR --spec FILE [--model-config FILE] [--tp-rank R] [--address ...] [--shm NAME]
// With --checkpoint the engine holds a model family's parameters in the spec's engine layout
// (fused, stacked, sharded, laid out, derived), loaded from the converted checkpoint DIR; the
// parameters refits never carry keep these loaded values. The spec's sizes come from
// --model-config, else DIR/config.json when there is one. --tp-rank R: the engine is rank R of
// an engine of the spec's tensor_parallel.size ranks (a spec without a rank): it holds that
// rank's part and registers its place (one process per rank, as TP workers are). --tp-size N:
// the engine's size, for a spec whose tensor_parallel.size is `engine` (needed with --tp-rank
// there; a spec that states its size must agree).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/engine_agent.h"
#include "common/checksum.h"
#include "common/control_connect.h"
#include "demo_model.h"
#include "lockstep.h"
#include "refit/checkpoint_io.h"
#include "refit/offline.h"
#include "spec/demo_spec.h"
#include "spec/model_spec.h"
#include "storage/shm_region.h"
#if REFIT_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

#include "common/cuda_status.h"
#include "cuda_vmm_alloc.h"
#endif

namespace {


std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

struct Served {
  std::shared_timed_mutex mu;  // requests hold it shared; pause holds it exclusive
  std::mutex state_mu;
  std::condition_variable cv;
  bool paused = false;
  uint64_t version = 0;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace refit;
  std::string address = refit::kDefaultControlAddress, spec_path, checkpoint_path, model_config_path,
              shm_name = absl::StrCat("/refit-engine-", getpid());
  int tp_rank = -1;  // --tp-rank: one rank of an engine of several
  demo::ModelShape shape;
  int gpu = -1;
  [[maybe_unused]] bool vmm = false;  // --vmm: the GPU memory is CUDA virtual memory, registered in place
  bool idle = false;  // requests read nothing (benchmarks: the pause then measures refitd alone)
  int pause_ms = 0;   // --pause-ms: a pause that takes this long (draining requests, flushing a cache)
  bool reconnect = false;
  std::string sleep_wake;  // --sleep-wake: sleep and wake at the trainer's orders (FIFOs)
  std::string lockstep_path, steps_path;  // --lockstep, --steps
  int lockstep_rank = 0, lockstep_size = 1;
  int tp_size = 0;  // --tp-size; 0: the spec's
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--address" && i + 1 < argc) {
      address = argv[++i];
    } else if (a == "--spec" && i + 1 < argc) {
      spec_path = argv[++i];
    } else if (a == "--checkpoint" && i + 1 < argc) {
      checkpoint_path = argv[++i];
    } else if (a == "--model-config" && i + 1 < argc) {
      model_config_path = argv[++i];
    } else if (a == "--tp-rank" && i + 1 < argc) {
      tp_rank = std::atoi(argv[++i]);
    } else if (a == "--tp-size" && i + 1 < argc) {
      tp_size = std::atoi(argv[++i]);
    } else if (a == "--shm" && i + 1 < argc) {
      shm_name = argv[++i];
    } else if (a == "--pause-ms" && i + 1 < argc) {
      pause_ms = std::atoi(argv[++i]);
    } else if (a == "--sleep-wake" && i + 1 < argc) {
      sleep_wake = argv[++i];
    } else if (a == "--idle") {
      idle = true;
    } else if (a == "--reconnect") {
      reconnect = true;
    } else if (a == "--lockstep" && i + 1 < argc) {
      lockstep_path = argv[++i];
    } else if (a == "--lockstep-rank" && i + 1 < argc) {
      lockstep_rank = std::atoi(argv[++i]);
    } else if (a == "--lockstep-size" && i + 1 < argc) {
      lockstep_size = std::atoi(argv[++i]);
    } else if (a == "--steps" && i + 1 < argc) {
      steps_path = argv[++i];
    } else if (a == "--gpu" && i + 1 < argc) {
      gpu = std::atoi(argv[++i]);
    } else if (a == "--vmm") {
      vmm = true;
    } else if (!demo::ParseShapeFlag(argc, argv, i, shape)) {
      std::fprintf(stderr, "example_engine: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (!sleep_wake.empty() && (gpu < 0 || !vmm)) {
    std::fprintf(stderr, "example_engine: --sleep-wake needs --gpu and --vmm (the memory a sleep gives back)\n");
    return 2;
  }
  if (model_config_path.empty() && !checkpoint_path.empty() &&
      std::filesystem::exists(std::filesystem::path(checkpoint_path) / "config.json")) {
    model_config_path = (std::filesystem::path(checkpoint_path) / "config.json").string();
  }
  std::optional<spec::ModelConfig> model_config;
  if (!model_config_path.empty()) {
    absl::StatusOr<spec::ModelConfig> c = spec::LoadModelConfigFile(model_config_path);
    if (!c.ok()) {
      std::fprintf(stderr, "example_engine: %s\n", std::string(c.status().message()).c_str());
      return 1;
    }
    model_config = std::move(*c);
  }
  absl::StatusOr<spec::ModelSpec> spec =
      spec_path.empty() ? spec::ParseModelSpec(spec::kDemoModelSpec)
                        : spec::LoadModelSpecFile(spec_path, {.model_config = model_config ? &*model_config : nullptr});
  if (spec.ok() && tp_size > 0) {
    spec = spec::WithEngineSize(*spec, tp_size);
  } else if (spec.ok() && spec->tp_size_from_engine && tp_rank >= 0) {
    spec = absl::InvalidArgumentError("--tp-rank: the spec's tensor_parallel.size is 'engine'; give --tp-size");
  }
  if (spec.ok() && spec->tp_size > 1 && !spec->tp_rank_given && tp_rank < 0 && tp_size > 0) {
    spec = absl::InvalidArgumentError("--tp-size: an engine of several ranks; give this one's --tp-rank");
  }
  client::EngineRank rank;
  if (spec.ok() && tp_rank >= 0) {
    rank.tp_rank = tp_rank;
    rank.tp_size = spec->tp_size;
    rank.ep_size = spec->ep_size > 1 ? spec->ep_size : 0;
    rank.ep_rank = spec->ep_size > 1 ? tp_rank : 0;
    spec = spec::ForRank(*spec, tp_rank);
  }
  if (!spec.ok()) {
    std::fprintf(stderr, "example_engine: %s\n", std::string(spec.status().message()).c_str());
    return 1;
  }
  // Lay out every parameter in one shm region, 256-byte aligned.
  std::vector<client::ShmParam> params;
  std::vector<uint64_t> sizes;
  std::vector<ConvertedTensor> initial;  // --checkpoint: the loaded engine layout
  uint64_t total = 0;
  auto add = [&](const std::string& name, DType dtype, const Shape& pshape, uint64_t nbytes) {
    params.push_back({name, dtype, pshape, shm_name, total});
    sizes.push_back(nbytes);
    total += (nbytes + 255) & ~uint64_t{255};
  };
  if (!checkpoint_path.empty()) {
    absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(checkpoint_path);
    absl::StatusOr<std::vector<ConvertedTensor>> conv =
        ckpt.ok() ? ConvertCheckpoint(*spec, (*ckpt)->tensors()) : absl::StatusOr<std::vector<ConvertedTensor>>(ckpt.status());
    absl::StatusOr<std::vector<ConvertedTensor>> layout =
        conv.ok() ? EngineLayout(*spec, (*ckpt)->infos(), ByName(*conv)) : conv;
    if (!layout.ok()) {
      std::fprintf(stderr, "example_engine: %s\n", std::string(layout.status().message()).c_str());
      return 1;
    }
    initial = std::move(*layout);
    for (const ConvertedTensor& t : initial) add(t.name, t.dtype, t.shape, t.bytes.size());
  } else {
    // The demo model's BF16 tensors in the spec's engine layout (fused, stacked, sharded, laid out).
    std::vector<storage::ParamInfo> inputs;
    for (const demo::HfTensor& t : demo::Tensors(shape)) {
      absl::StatusOr<uint64_t> n = DenseBytes(DType::kBF16, t.shape);
      if (!n.ok()) return 1;
      inputs.push_back({t.name, DType::kBF16, t.shape, *n});
    }
    absl::StatusOr<std::vector<storage::ParamInfo>> layout = EngineParamInfos(*spec, inputs);
    if (!layout.ok()) {
      std::fprintf(stderr, "example_engine: %s\n", std::string(layout.status().message()).c_str());
      return 1;
    }
    for (const storage::ParamInfo& p : *layout) add(p.name, p.dtype, p.shape, p.nbytes);
  }
  // The parameters' memory: a shm region, or one GPU allocation.
  std::unique_ptr<storage::ShmRegion> region;
  const uint8_t* base = nullptr;
  std::vector<uint8_t> host_copy;
#if REFIT_HAVE_CUDA
  void* device_base = nullptr;
  std::array<uint8_t, 64> ipc_handle{};
  refit::examples::VmmMemory vmm_memory;
#endif
  if (gpu < 0) {
    absl::StatusOr<std::unique_ptr<storage::ShmRegion>> r = storage::ShmRegion::Create(shm_name, total);
    if (!r.ok()) {
      std::fprintf(stderr, "example_engine: %s\n", std::string(r.status().message()).c_str());
      return 1;
    }
    region = std::move(*r);
    base = region->data();
  } else {
#if REFIT_HAVE_CUDA
    cudaIpcMemHandle_t h;
    std::string why;
    if (vmm && (cudaSetDevice(gpu) != cudaSuccess || !vmm_memory.Allocate(gpu, total, why) ||
                (device_base = vmm_memory.data(), cudaMemset(device_base, 0, total) != cudaSuccess))) {
      std::fprintf(stderr, "example_engine: cannot allocate %llu bytes of CUDA virtual memory on GPU %d: %s\n",
                   static_cast<unsigned long long>(total), gpu, why.c_str());
      return 1;
    }
    if (!vmm && (cudaSetDevice(gpu) != cudaSuccess || cudaMalloc(&device_base, total) != cudaSuccess ||
                 cudaMemset(device_base, 0, total) != cudaSuccess || cudaIpcGetMemHandle(&h, device_base) != cudaSuccess)) {
      std::fprintf(stderr, "example_engine: cannot allocate %llu bytes on GPU %d: %s\n",
                   static_cast<unsigned long long>(total), gpu, cudaGetErrorString(cudaGetLastError()));
      return 1;
    }
    if (!vmm) std::memcpy(ipc_handle.data(), &h, sizeof(h));
    host_copy.resize(total);
    base = host_copy.data();
#else
    std::fprintf(stderr, "example_engine: built without CUDA; --gpu is unavailable\n");
    return 2;
#endif
  }
  for (size_t i = 0; i < initial.size(); ++i) {
#if REFIT_HAVE_CUDA
    if (gpu >= 0) {
      cudaMemcpy(static_cast<uint8_t*>(device_base) + params[i].offset, initial[i].bytes.data(),
                 initial[i].bytes.size(), cudaMemcpyHostToDevice);
      continue;
    }
#endif
    std::memcpy(region->data() + params[i].offset, initial[i].bytes.data(), initial[i].bytes.size());
  }
  // A request reads every parameter (on the GPU path: copies all of them to the host first).
  auto checksum_all = [&]() {
#if REFIT_HAVE_CUDA
    if (gpu >= 0) cudaMemcpy(host_copy.data(), device_base, total, cudaMemcpyDeviceToHost);
#endif
    uint64_t sum = 0;
    for (size_t i = 0; i < params.size(); ++i) sum = Checksum64(base + params[i].offset, sizes[i], sum);
    return sum;
  };

  Served served;
  client::EngineCallbacks callbacks;
  // --lockstep: a pause is pending (or held) from its request to the resume; the serving loop
  // acknowledges it at a round in which no rank stepped.
  refit::examples::Lockstep lockstep;
  if (!lockstep_path.empty() && !lockstep.Open(lockstep_path, lockstep_rank, lockstep_size, steps_path)) {
    std::fprintf(stderr, "example_engine: cannot open the lockstep barrier %s or steps log %s\n", lockstep_path.c_str(),
                 steps_path.c_str());
    return 1;
  }
  std::atomic<bool> pause_pending{false}, pause_acked{false};
  // The serving loop runs: before it does (refitd may pause the engine while it registers), a
  // pause holds at once, and the loop starts paused.
  std::atomic<bool> serving{false};
  std::string served_tag;  // the tag of the weights served (state_mu)
  callbacks.pause = [&] {
    if (!lockstep_path.empty()) {
      if (!pause_pending.exchange(true)) pause_acked = false;
      while (serving.load() && !pause_acked.load() && !g_stop.load())
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      std::lock_guard<std::mutex> l(served.state_mu);
      served.paused = true;
      return;
    }
    if (pause_ms > 0) {
      std::printf("{\"event\":\"pausing\"}\n");
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    }
    served.mu.lock();  // waits for in-flight requests; no request starts until resume
    std::lock_guard<std::mutex> l(served.state_mu);
    served.paused = true;
  };
  std::atomic<uint64_t> last_checksum{0};
  callbacks.resume_tagged = [&](uint64_t v, const std::string& tag) {
    if (!lockstep_path.empty()) {
      {
        std::lock_guard<std::mutex> l(served.state_mu);
        served.paused = false;
        served.version = v;
        served_tag = tag;
      }
      pause_pending = false;
      std::printf("{\"event\":\"resumed\",\"version\":%llu,\"tag\":\"%s\",\"checksum\":\"\"}\n",
                  static_cast<unsigned long long>(v), tag.c_str());
      std::fflush(stdout);
      return;
    }
    {
      std::lock_guard<std::mutex> l(served.state_mu);
      served.paused = false;
      served.version = v;
    }
    uint64_t sum = idle ? 0 : checksum_all();
    last_checksum = sum;
    served.mu.unlock();
    // A tag is 0..128 bytes of [A-Za-z0-9._:+-]: nothing to escape in JSON.
    std::printf("{\"event\":\"resumed\",\"version\":%llu,\"tag\":\"%s\",\"checksum\":\"%s\"}\n",
                static_cast<unsigned long long>(v), tag.c_str(), ChecksumHex(sum).c_str());
    std::fflush(stdout);
  };

  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  absl::StatusOr<std::unique_ptr<client::EngineAgent>> agent = absl::UnknownError("not started");
  if (gpu < 0) {
    agent = client::EngineAgent::Start(address, params, callbacks, 0, reconnect, "", rank);
  } else {
#if REFIT_HAVE_CUDA
    if (vmm) {
      std::vector<client::DevicePtrParam> in_place;
      for (const client::ShmParam& p : params) {
        in_place.push_back({p.name, p.dtype, p.shape, static_cast<uint8_t*>(device_base) + p.offset});
      }
      agent = client::EngineAgent::Start(address, std::move(in_place), callbacks, 0, reconnect, "", rank);
    } else {
      std::vector<client::CudaParam> cuda;
      for (const client::ShmParam& p : params) cuda.push_back({p.name, p.dtype, p.shape, ipc_handle, p.offset, gpu, nullptr});
      agent = client::EngineAgent::Start(address, std::move(cuda), callbacks, 0, reconnect, "", rank);
    }
#endif
  }
  if (!agent.ok()) {
    std::fprintf(stderr, "example_engine: %s\n", std::string(agent.status().message()).c_str());
    return 1;
  }
  std::printf("{\"event\":\"registered\",\"params\":%zu,\"bytes\":%llu,\"shm\":\"%s\",\"gpu\":%d}\n",
              params.size(), static_cast<unsigned long long>(total), gpu < 0 ? shm_name.c_str() : "", gpu);
  std::fflush(stdout);

  // --sleep-wake: sleep (the weights' memory given back) and wake at the trainer's orders.
  int ctl_fd = -1, ack_fd = -1;  // --sleep-wake: the trainer's orders, our answers
  if (!sleep_wake.empty()) {
    // Opened read-write: neither open waits for the trainer.
    ctl_fd = open((sleep_wake + ".ctl").c_str(), O_RDWR | O_CLOEXEC);
    ack_fd = open((sleep_wake + ".ack").c_str(), O_RDWR | O_CLOEXEC);
    if (ctl_fd < 0 || ack_fd < 0) {
      std::fprintf(stderr, "example_engine: cannot open the FIFOs %s.ctl and %s.ack: %s\n", sleep_wake.c_str(),
                   sleep_wake.c_str(), std::strerror(errno));
      return 1;
    }
  }
  auto current_version = [&] {
    std::lock_guard<std::mutex> l(served.state_mu);
    return served.version;
  };
  uint64_t served_version = 0;  // the version the last request saw
  bool sleep_asked = false;     // an 's' came: the engine sleeps once a request saw the version it holds
  bool woken = false;           // a wake came: the memory holds no weights until a resume
  uint64_t woken_at = 0;        // the version held at that wake
  [[maybe_unused]] auto sleep_and_wake = [&]() -> absl::Status {
#if REFIT_HAVE_CUDA
    // A resume runs inside refitd's commit, which ends just after it: a sleep refused as busy
    // (Unavailable) is asked again.
    absl::Status slept;
    for (int tries = 0; tries < 30000; ++tries) {
      if (!absl::IsUnavailable(slept = (*agent)->Sleep())) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (!slept.ok()) return slept;
    size_t free_before = 0, free_after = 0, device_total = 0;
    std::string why;
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemGetInfo(&free_before, &device_total) != cudaSuccess ||
        !vmm_memory.Unmap(why) || cudaMemGetInfo(&free_after, &device_total) != cudaSuccess) {
      return absl::InternalError(absl::StrCat("cannot give the weights' memory back: ", why));
    }
    std::printf("{\"event\":\"asleep\",\"version\":%llu,\"freed_bytes\":%lld,\"free_bytes\":%zu}\n",
                static_cast<unsigned long long>(served_version),
                static_cast<long long>(free_after) - static_cast<long long>(free_before), free_after);
    std::fflush(stdout);
    if (write(ack_fd, "a", 1) != 1) return absl::InternalError(absl::StrCat("cannot write to ", sleep_wake, ".ack"));
    char order = 0;
    for (;;) {  // asleep until the trainer's 'w' (or the engine is stopped)
      pollfd p{ctl_fd, POLLIN, 0};
      if (g_stop.load()) return absl::CancelledError("stopped while asleep");
      if (poll(&p, 1, 100) == 1 && read(ctl_fd, &order, 1) == 1) {
        if (order == 'w') break;
        return absl::InvalidArgumentError(absl::StrCat("order '", std::string(1, order), "' while asleep (only 'w')"));
      }
    }
    if (!vmm_memory.Map(why)) return absl::InternalError(absl::StrCat("cannot map the weights' memory again: ", why));
    absl::StatusOr<bool> woke = (*agent)->Wake();
    if (!woke.ok()) return woke.status();
    std::printf("{\"event\":\"awake\",\"committed\":%s}\n", *woke ? "true" : "false");
    std::fflush(stdout);
    woken = !*woke;  // a refit staged while asleep was committed at the wake: its version is served
    woken_at = current_version();
    if (write(ack_fd, "w", 1) != 1) return absl::InternalError(absl::StrCat("cannot write to ", sleep_wake, ".ack"));
    return absl::OkStatus();
#else
    return absl::UnimplementedError("built without CUDA");
#endif
  };

  // Serve until told to stop; each request sees one version, whole.
  std::map<uint64_t, uint64_t> seen;  // version -> checksum
  uint64_t requests = 0, mixed = 0;
  uint64_t registrations = 1;
  serving = true;
  while (!g_stop.load() && (reconnect || (*agent)->connected())) {
    if (ctl_fd >= 0 && !sleep_asked) {
      pollfd p{ctl_fd, POLLIN, 0};
      char order = 0;
      if (poll(&p, 1, 0) == 1 && read(ctl_fd, &order, 1) == 1) {
        if (order != 's') {
          std::fprintf(stderr, "example_engine: order '%c' while awake (only 's')\n", order);
          return 1;
        }
        sleep_asked = true;
      }
    }
    // Asked to sleep, and the rollout of the version held is done: the engine sleeps.
    if (sleep_asked && requests > 0 && served_version == current_version()) {
      sleep_asked = false;
      if (absl::Status s = sleep_and_wake(); !s.ok()) {
        if (absl::IsCancelled(s)) break;
        std::fprintf(stderr, "example_engine: sleep and wake after version %llu: %s\n",
                     static_cast<unsigned long long>(served_version), std::string(s.message()).c_str());
        return 1;
      }
      continue;
    }
    if (woken && current_version() == woken_at) {  // woken, the next refit not committed yet
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    woken = false;
    if ((*agent)->registrations() != registrations) {
      registrations = (*agent)->registrations();
      std::printf("{\"event\":\"reregistered\",\"version\":%llu,\"dirty\":%s}\n",
                  static_cast<unsigned long long>((*agent)->version()), (*agent)->dirty() ? "true" : "false");
      std::fflush(stdout);
    }
    if (!lockstep_path.empty()) {
      const bool flag = pause_pending.load();
      if (!lockstep.Round(flag, g_stop)) {
        if (flag && !g_stop.load()) pause_acked = true;  // no rank stepped this round: paused here
        continue;
      }
      std::string tag;
      {
        std::lock_guard<std::mutex> l(served.state_mu);
        tag = served_tag;
        served_version = served.version;
      }
      lockstep.Step(tag);
      ++requests;
      continue;
    }
    std::shared_lock<std::shared_timed_mutex> lock(served.mu, std::chrono::milliseconds(50));
    if (!lock.owns_lock()) continue;  // paused (or stuck paused after losing refitd: weights dirty)
    served_version = served.version;
    if (idle) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++requests;
      continue;
    }
    uint64_t v = served.version;
    uint64_t sum = checksum_all();
    auto [it, fresh] = seen.emplace(v, sum);
    if (!fresh && it->second != sum) ++mixed;
    ++requests;
  }
  bool dirty = (*agent)->dirty();
  agent->reset();
  std::string versions;
  for (const auto& [v, sum] : seen) absl::StrAppend(&versions, versions.empty() ? "" : ",", "[", v, ",\"", ChecksumHex(sum), "\"]");
  std::printf("{\"event\":\"exit\",\"requests\":%llu,\"mixed\":%llu,\"dirty\":%s,\"versions\":[%s]}\n",
              static_cast<unsigned long long>(requests), static_cast<unsigned long long>(mixed),
              dirty ? "true" : "false", versions.c_str());
  return mixed == 0 ? 0 : 3;
}
