#include "client/engine_agent.h"

#include "client/cuda_export.h"
#include "common/busy_poll.h"
#include "common/control_connect.h"
#include "common/fd_passing.h"
#include "common/trace.h"

#include <future>
#include <map>

#include "absl/strings/str_cat.h"
#include "capnp/rpc-twoparty.h"
#include "kj/async-io.h"
#include "kj/mutex.h"
#include "proto/refit.capnp.h"
#include "proto/wire.h"

namespace refit::client {

struct EngineAgent::Impl {
  std::promise<absl::Status> registered;
  // Agent thread only (Run, and Sleep/Wake through the executor).
  Params params;                                        // what the next (re)registration sends
  kj::Maybe<proto::Registration::Client> registration;  // while registered
  std::vector<InPlaceRecord> in_place;                  // parameters registered in place, for the audit
  bool passes_fds = false;                              // the connection is a Unix socket
  kj::Own<kj::PromiseFulfiller<void>> on_heat;          // busy polling: the next pause or wake heats the loop
  absl::Time paused_at;                                 // busy polling: the last pause
  absl::Time expect_until = absl::InfinitePast();       // busy polling: woke; the refit's pause comes next
  void Heat() {
    if (on_heat.get() != nullptr) on_heat->fulfill();
    on_heat = nullptr;
  }
  kj::MutexGuarded<kj::Own<const kj::Executor>> executor;
  // Stop: fulfilled from any thread (the destructor) without waiting for the agent's loop, which
  // may be ending on its own (a waiting cross-thread call to a loop that ended can hang).
  struct StopSignal {
    bool requested = false;
    kj::Own<kj::CrossThreadPromiseFulfiller<void>> fulfiller;  // while the agent's loop runs
  };
  kj::MutexGuarded<StopSignal> stop;
  bool stopping = false;  // agent thread only
};

namespace {

// Busy polling (common/busy_poll.h): the agent's loop spins for at most this long per pause, and
// after a wake with nothing staged (in a colocated loop the trainer's refit, and with it a pause,
// follows the wake) until the next pause, for at most kBusyWakeBound.
constexpr absl::Duration kBusyPauseBound = absl::Seconds(2);
constexpr absl::Duration kBusyWakeBound = absl::Seconds(1);

// A CUDA virtual-memory allocation's descriptor as a capability: Cap'n Proto attaches it to every
// message that carries the capability (over a connection that passes descriptors).
class SharedFdServer final : public proto::SharedFd::Server {
 public:
  SharedFdServer(std::shared_ptr<const VmmAllocation> allocation, size_t piece)
      : allocation_(std::move(allocation)), piece_(piece) {}
  kj::Maybe<int> getFd() override {
    const int fd = allocation_->pieces[piece_].fd.get();
    if (fd < 0) return nullptr;  // closed by a sleep
    return fd;
  }

 private:
  std::shared_ptr<const VmmAllocation> allocation_;
  const size_t piece_;
};

// The registration request's parameter list.
void FillParams(capnp::List<proto::EngineParam>::Builder list, const std::variant<std::vector<ShmParam>,
                                                                                    std::vector<CudaParam>>& params) {
  auto fill_common = [](auto b, const std::string& name, DType dtype, const Shape& shape) {
    b.setName(name);
    b.setDtype(std::string(DTypeName(dtype)));
    auto s = b.initShape(static_cast<unsigned>(shape.size()));
    for (size_t d = 0; d < shape.size(); ++d) s.set(static_cast<unsigned>(d), shape[d]);
    absl::StatusOr<uint64_t> n = DenseBytes(dtype, shape);
    b.setNbytes(n.ok() ? *n : 0);
  };
  if (auto* shm = std::get_if<std::vector<ShmParam>>(&params)) {
    for (size_t i = 0; i < shm->size(); ++i) {
      const ShmParam& p = (*shm)[i];
      auto b = list[static_cast<unsigned>(i)];
      fill_common(b, p.name, p.dtype, p.shape);
      b.getStorage().initShm().setName(p.shm_name);
      b.getStorage().getShm().setOffset(p.offset);
    }
    return;
  }
  const auto& cuda = std::get<std::vector<CudaParam>>(params);
  std::map<const VmmAllocation*, uint32_t> allocations;  // numbered in order of first use
  for (size_t i = 0; i < cuda.size(); ++i) {
    const CudaParam& p = cuda[i];
    auto b = list[static_cast<unsigned>(i)];
    fill_common(b, p.name, p.dtype, p.shape);
    if (p.vmm != nullptr) {
      auto v = b.getStorage().initCudaVmm();
      auto [it, first] = allocations.emplace(p.vmm.get(), static_cast<uint32_t>(allocations.size()));
      // One descriptor per piece of an allocation: only its first parameter carries them.
      if (first && p.vmm->pieces.size() == 1) v.setFd(kj::heap<SharedFdServer>(p.vmm, 0));
      if (first && p.vmm->pieces.size() > 1) {
        auto pieces = v.initPieces(static_cast<unsigned>(p.vmm->pieces.size()));
        for (size_t k = 0; k < p.vmm->pieces.size(); ++k) {
          pieces[static_cast<unsigned>(k)].setFd(kj::heap<SharedFdServer>(p.vmm, k));
          pieces[static_cast<unsigned>(k)].setSize(p.vmm->pieces[k].size);
        }
      }
      v.setAllocation(it->second);
      v.setOffset(p.offset);
      v.setSize(p.vmm->size);
      v.setDevice(p.vmm->device);
      continue;
    }
    auto c = b.getStorage().initCudaIpc();
    c.setHandle(kj::arrayPtr(p.ipc_handle.data(), p.ipc_handle.size()));
    c.setOffset(p.offset);
    c.setDevice(p.device);
  }
}

// Whether `params` can be registered over this connection: CUDA virtual-memory parameters need one
// that passes file descriptors, at most kMaxFdsPerMessage of them. Refusals name the parameter.
absl::Status CheckDescriptors(const std::variant<std::vector<ShmParam>, std::vector<CudaParam>>& params,
                              bool passes_fds) {
  const auto* cuda = std::get_if<std::vector<CudaParam>>(&params);
  if (cuda == nullptr) return absl::OkStatus();
  std::map<const VmmAllocation*, uint32_t> allocations;
  size_t descriptors = 0;
  for (const CudaParam& p : *cuda) {
    if (p.vmm == nullptr) continue;
    if (!passes_fds) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", p.name, "' is in CUDA virtual memory, whose file descriptor passes to refitd only over a ",
          "unix: control connection (this one is TCP or TLS): connect to refitd's Unix socket"));
    }
    bool valid = !p.vmm->pieces.empty();
    for (const VmmPiece& piece : p.vmm->pieces) valid = valid && piece.fd.valid();
    if (!valid) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "': its CUDA virtual-memory allocation has no file descriptor"));
    }
    if (!allocations.emplace(p.vmm.get(), 0).second) continue;
    descriptors += p.vmm->pieces.size();
    if (descriptors > kMaxFdsPerMessage) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", p.name, "' is in CUDA virtual memory past the ", kMaxFdsPerMessage,
          " file descriptors (mapped pieces) one registration passes"));
    }
  }
  return absl::OkStatus();
}

size_t CountParams(const std::variant<std::vector<ShmParam>, std::vector<CudaParam>>& params) {
  return std::visit([](const auto& v) { return v.size(); }, params);
}

class ControlImpl final : public proto::EngineControl::Server {
 public:
  ControlImpl(EngineCallbacks& cb, std::atomic<uint64_t>& version, std::mutex& tag_mu, std::string& tag,
              std::atomic<bool>& paused, std::atomic<bool>& dirty, const std::vector<InPlaceRecord>& in_place,
              std::function<void()> on_pause = nullptr)
      : cb_(cb), version_(version), tag_mu_(tag_mu), tag_(tag), paused_(paused), dirty_(dirty), in_place_(in_place),
        on_pause_(std::move(on_pause)) {}

 protected:

  kj::Promise<void> pause(PauseContext context) override {
    TracePoint("engine.pause_received");
    if (!paused_.load()) {
      if (cb_.pause) cb_.pause();
      paused_ = true;
    }
    dirty_ = true;  // from here until resume, the parameters may hold a mix of versions
    // The registration audit, once nothing reads the parameters: refitd writes nothing when
    // anything is stale.
    std::vector<std::string> stale = AuditInPlace(in_place_);
    if (cb_.audit) {
      for (std::string& name : cb_.audit()) stale.push_back(std::move(name));
    }
    TracePoint("engine.paused");
    if (on_pause_) on_pause_();
    auto list = context.getResults().initStale(static_cast<unsigned>(stale.size()));
    for (size_t i = 0; i < stale.size(); ++i) list.set(static_cast<unsigned>(i), stale[i]);
    return kj::READY_NOW;
  }
  kj::Promise<void> resume(ResumeContext context) override {
    TracePoint("engine.resume_received");
    uint64_t v = context.getParams().getVersion();
    std::string tag = wire::Str(context.getParams().getTag());
    {
      std::lock_guard<std::mutex> lock(tag_mu_);
      tag_ = tag;
    }
    if (!paused_.load()) {
      // refitd sends a resume after a pause that timed out; if that pause never reached the
      // engine, there is nothing to resume and the weights were never touched.
      version_ = v;
      return kj::READY_NOW;
    }
    version_ = v;
    dirty_ = false;
    paused_ = false;
    if (cb_.resume_tagged) {
      cb_.resume_tagged(v, tag);
    } else if (cb_.resume) {
      cb_.resume(v);
    }
    return kj::READY_NOW;
  }

 private:
  EngineCallbacks& cb_;
  std::atomic<uint64_t>& version_;
  std::mutex& tag_mu_;
  std::string& tag_;
  std::atomic<bool>& paused_;
  std::atomic<bool>& dirty_;
  const std::vector<InPlaceRecord>& in_place_;  // agent thread, like every call here
  std::function<void()> on_pause_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EngineAgent>> EngineAgent::Start(const std::string& address, std::vector<ShmParam> params,
                                                                EngineCallbacks callbacks, uint64_t version,
                                                                bool reconnect, std::string tag, EngineRank rank) {
  return StartAny(address, std::move(params), std::move(callbacks), version, reconnect, std::move(tag),
                  std::move(rank), {}, 0);
}

absl::StatusOr<std::unique_ptr<EngineAgent>> EngineAgent::Start(const std::string& address, std::vector<CudaParam> params,
                                                                EngineCallbacks callbacks, uint64_t version,
                                                                bool reconnect, std::string tag, EngineRank rank) {
  return StartAny(address, std::move(params), std::move(callbacks), version, reconnect, std::move(tag),
                  std::move(rank), {}, 0);
}

absl::StatusOr<std::unique_ptr<EngineAgent>> EngineAgent::Start(const std::string& address,
                                                                std::vector<DevicePtrParam> params,
                                                                EngineCallbacks callbacks, uint64_t version,
                                                                bool reconnect, std::string tag, EngineRank rank) {
  absl::StatusOr<InPlaceExport> exported = ExportInPlace(params);
  if (!exported.ok()) return exported.status();
  const size_t allocations = exported->allocations;
  std::vector<InPlaceRecord> records = std::move(exported->records);
  return StartAny(address, std::move(exported->params), std::move(callbacks), version, reconnect, std::move(tag),
                  std::move(rank), std::move(records), allocations);
}

absl::StatusOr<std::unique_ptr<EngineAgent>> EngineAgent::StartAny(const std::string& address, Params params,
                                                                   EngineCallbacks callbacks, uint64_t version,
                                                                   bool reconnect, std::string tag, EngineRank rank,
                                                                   std::vector<InPlaceRecord> in_place,
                                                                   size_t allocations) {
  if (absl::Status checked = CheckTag(tag); !checked.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("engine tag: ", checked.message()));
  }
  std::unique_ptr<EngineAgent> agent(new EngineAgent());
  agent->tag_.value = std::move(tag);
  agent->reconnect_ = reconnect;
  agent->rank_ = std::move(rank);
  agent->callbacks_ = std::move(callbacks);
  agent->version_ = version;
  agent->impl_ = std::make_unique<Impl>();
  agent->impl_->in_place = std::move(in_place);
  agent->allocations_ = allocations;
  std::future<absl::Status> registered = agent->impl_->registered.get_future();
  EngineAgent* a = agent.get();
  agent->thread_ = std::thread([a, address, params = std::move(params)]() mutable {
    a->Run(address, std::move(params));
  });
  absl::Status st = registered.get();
  if (!st.ok()) return st;
  return agent;
}

std::string EngineAgent::tag() const {
  std::lock_guard<std::mutex> lock(tag_.mu);
  return tag_.value;
}

void EngineAgent::Run(std::string address, Params initial) {
  impl_->params = std::move(initial);
  bool reported = false;
  auto report = [&](absl::Status st) {
    if (!reported) impl_->registered.set_value(std::move(st));
    reported = true;
  };
  auto io = kj::setupAsyncIo();
  auto stop = kj::newPromiseAndCrossThreadFulfiller<void>();
  {
    auto signal = impl_->stop.lockExclusive();
    if (signal->requested) stop.fulfiller->fulfill();
    signal->fulfiller = kj::mv(stop.fulfiller);
  }
  kj::ForkedPromise<void> stopped = stop.promise.then([this] { impl_->stopping = true; }).fork();
  *impl_->executor.lockExclusive() = kj::getCurrentThreadExecutor().addRef();
  while (true) {
    // One connection: register, then serve pause/resume until refitd goes away or Stop.
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
      absl::StatusOr<ControlClientOptions> options = ControlClientOptionsFromEnv();
      absl::StatusOr<kj::Own<kj::AsyncIoStream>> connected =
          options.ok() ? ConnectControl(io.provider->getNetwork(), io.waitScope, address, *options)
                       : absl::StatusOr<kj::Own<kj::AsyncIoStream>>(options.status());
      if (!connected.ok()) {
        // Handled like a lost connection: reported on the first attempt, retried after that.
        kj::throwFatalException(kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                                              kj::heapString(std::string(connected.status().message()).c_str())));
      }
      kj::Own<kj::AsyncIoStream> conn = kj::mv(*connected);
      // Over a Unix socket the connection passes file descriptors (CUDA virtual-memory parameters).
      kj::Own<capnp::TwoPartyClient> rpc;
      impl_->passes_fds = false;
      KJ_IF_MAYBE(caps, UnixCapabilityStream(*conn)) {
        rpc = kj::heap<capnp::TwoPartyClient>(*caps, kMaxFdsPerMessage);
        impl_->passes_fds = true;
      } else {
        rpc = kj::heap<capnp::TwoPartyClient>(*conn);
      }
      if (absl::Status st = CheckDescriptors(impl_->params, impl_->passes_fds); !st.ok()) {
        // The same on every attempt: reported as a refusal, never retried.
        if (!reported) report(st);
        impl_->stopping = true;
        return;
      }
      auto daemon = rpc->bootstrap().castAs<proto::Daemon>();
      auto req = daemon.registerEngineRequest();
      FillParams(req.initParams(static_cast<unsigned>(CountParams(impl_->params))), impl_->params);
      req.setControl(
          kj::heap<ControlImpl>(callbacks_, version_, tag_.mu, tag_.value, paused_, dirty_, impl_->in_place, [this] {
            impl_->paused_at = absl::Now();
            impl_->expect_until = absl::InfinitePast();
            impl_->Heat();
          }));
      req.setVersion(version_.load());
      req.setTag(wire::Text(tag()));
      req.setDirty(dirty_.load());
      req.setTpRank(rank_.tp_rank);
      req.setTpSize(rank_.tp_size);
      req.setEpRank(rank_.ep_rank);
      req.setEpSize(rank_.ep_size);
      req.setDevice(rank_.device);
      req.setModel(wire::Text(rank_.model));
      absl::Status st;
      {
        // The response goes at once: dropping it finishes the call. Cap'n Proto keeps a call
        // whose answer carries a capability (Registration) until then, and with it the request's
        // capabilities, each holding the file descriptor it carried: kept for the whole
        // connection, they kept the engine's CUDA memory after it released it at a sleep.
        auto resp = req.send().wait(io.waitScope);
        st = wire::FromWire(resp.getStatus());
        if (st.ok()) impl_->registration = resp.getRegistration();
      }
      if (!st.ok()) {
        // Refused by refitd (another engine is registered, a parameter it cannot map, a spec
        // mismatch): reported as it is, never retried.
        if (!reported) {
          report(absl::Status(st.code(), absl::StrCat("engine registration with refitd at '", address,
                                                      "' refused: ", st.message())));
        }
        impl_->stopping = true;
        return;
      }
      asleep_ = false;
      connected_ = true;
      ++registrations_;
      report(absl::OkStatus());
      auto ended = stopped.addBranch().exclusiveJoin(rpc->onDisconnect()).fork();
      if (BusyPollWanted("auto")) {
        // While paused (refitd writes the weights; the resume is next) the loop spins, for at
        // most kBusyPauseBound per pause (a pause that lasts, e.g. an engine left dirty, blocks),
        // and after a wake until the pause (kBusyWakeBound).
        WaitBusyPolling(
            ended, io.waitScope,
            [this] {
              const absl::Time now = absl::Now();
              return now < impl_->expect_until || (paused_.load() && now - impl_->paused_at < kBusyPauseBound);
            },
            [this] {
              auto paf = kj::newPromiseAndFulfiller<void>();
              impl_->on_heat = kj::mv(paf.fulfiller);
              return kj::mv(paf.promise);
            });
      }
      ended.addBranch().wait(io.waitScope);
      impl_->on_heat = nullptr;
      impl_->registration = nullptr;
    })) {
      if (!reported) {
        std::string msg = e->getDescription().cStr();
        constexpr std::string_view kPrefix = "remote exception: ";
        if (msg.rfind(kPrefix, 0) == 0) msg = msg.substr(kPrefix.size());
        report(absl::UnavailableError(
            absl::StrCat("engine registration with refitd at '", address, "' failed: ", msg, TlsDisconnectHint(msg))));
        break;
      }
    }
    impl_->registration = nullptr;
    connected_ = false;
    if (paused_.load()) dirty_ = true;  // disconnected inside the commit window: weights may be mixed
    if (impl_->stopping || !reconnect_) break;
    // refitd went away: retry until it is back (or Stop).
    stopped.addBranch().exclusiveJoin(io.provider->getTimer().afterDelay(100 * kj::MILLISECONDS)).wait(io.waitScope);
    if (impl_->stopping) break;
  }
  *impl_->executor.lockExclusive() = nullptr;
  impl_->stop.lockExclusive()->fulfiller = nullptr;
}

namespace {

// Runs `f` (returning a promise of T) on the agent's loop and waits for it; Unavailable when the
// agent's loop has ended or the call failed with an exception (refitd gone).
template <typename T, typename F>
T OnAgentLoop(kj::MutexGuarded<kj::Own<const kj::Executor>>& guarded, F f) {
  kj::Own<const kj::Executor> executor;
  {
    auto locked = guarded.lockExclusive();
    if (locked->get() != nullptr) executor = (*locked)->addRef();
  }
  if (executor.get() == nullptr) return absl::UnavailableError("the engine agent has stopped");
  T result = absl::UnavailableError("refitd did not answer");
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { result = executor->executeSync(kj::mv(f)); })) {
    return absl::UnavailableError(absl::StrCat("lost refitd: ", e->getDescription().cStr()));
  }
  return result;
}

}  // namespace

absl::Status EngineAgent::Sleep() {
  return OnAgentLoop<absl::Status>(impl_->executor, [this]() -> kj::Promise<absl::Status> {
    KJ_IF_MAYBE(r, impl_->registration) {
      return r->sleepRequest().send().then([this](capnp::Response<proto::Registration::SleepResults>&& resp) {
        absl::Status st = wire::FromWire(resp.getStatus());
        if (st.ok()) {
          asleep_ = true;
          DropDescriptors();  // so that the engine's release of virtual memory frees it
        }
        return st;
      });
    }
    return absl::Status(absl::UnavailableError("the engine is not registered with refitd (not connected)"));
  });
}

absl::StatusOr<bool> EngineAgent::WakeAny(std::optional<Params> params,
                                          std::optional<std::vector<InPlaceRecord>> in_place, size_t allocations) {
  auto wanted = std::make_shared<std::optional<Params>>(std::move(params));
  auto records = std::make_shared<std::optional<std::vector<InPlaceRecord>>>(std::move(in_place));
  auto count = std::make_shared<size_t>(allocations);
  return OnAgentLoop<absl::StatusOr<bool>>(impl_->executor, [this, wanted, records,
                                                             count]() -> kj::Promise<absl::StatusOr<bool>> {
    KJ_IF_MAYBE(r, impl_->registration) {
      if (!*wanted && !impl_->in_place.empty()) {
        // Registered in place: exported again from the same addresses (the memory behind them
        // may be new after a sleep, which also dropped the virtual-memory descriptors).
        absl::StatusOr<InPlaceExport> exported = ExportInPlace(InPlacePointers());
        if (!exported.ok()) return absl::StatusOr<bool>(exported.status());
        *wanted = Params(std::move(exported->params));
        *records = std::move(exported->records);
        *count = exported->allocations;
      }
      if (absl::Status st = CheckDescriptors(*wanted ? **wanted : impl_->params, impl_->passes_fds); !st.ok()) {
        return absl::StatusOr<bool>(st);  // the engine stays asleep, registered as before
      }
      if (*wanted) {
        impl_->params = std::move(**wanted);  // what the wake and any later re-registration send
        if (*records) {
          impl_->in_place = std::move(**records);  // the audit of the wake's commit checks the new addresses
          allocations_ = *count;
        } else {
          impl_->in_place.clear();
          allocations_ = 0;
        }
      }
      auto req = r->wakeRequest();
      FillParams(req.initParams(static_cast<unsigned>(CountParams(impl_->params))), impl_->params);
      return req.send().then([this](capnp::Response<proto::Registration::WakeResults>&& resp) -> absl::StatusOr<bool> {
        absl::Status st = wire::FromWire(resp.getStatus());
        const bool ran = resp.getReport().getSessionId() != 0;  // a staged refit's commit ran
        if (st.ok() || ran) asleep_ = false;                    // mapped again, whatever the commit's outcome
        if (st.ok() && !ran) {
          impl_->expect_until = absl::Now() + kBusyWakeBound;  // (busy polling only: see Run)
          impl_->Heat();
        }
        if (!st.ok()) {
          return absl::Status(st.code(), absl::StrCat(ran ? "woke, but the refit staged while asleep did not commit: "
                                                          : "wake refused: ",
                                                      st.message()));
        }
        return resp.getCommitted();
      });
    }
    return absl::StatusOr<bool>(absl::UnavailableError("the engine is not registered with refitd (not connected)"));
  });
}

absl::StatusOr<bool> EngineAgent::Wake() { return WakeAny(std::nullopt, std::nullopt, 0); }

void EngineAgent::DropDescriptors() {
  auto* cuda = std::get_if<std::vector<CudaParam>>(&impl_->params);
  if (cuda == nullptr) return;
  // Closed where they are, not replaced: a capability that carried a descriptor to refitd may
  // still hold its allocation record (Cap'n Proto keeps an export until the peer releases it).
  for (CudaParam& p : *cuda) {
    if (p.vmm == nullptr) continue;
    for (const VmmPiece& piece : p.vmm->pieces) piece.fd.reset();
  }
}

std::vector<DevicePtrParam> EngineAgent::InPlacePointers() const {
  std::vector<DevicePtrParam> out;
  const auto* cuda = std::get_if<std::vector<CudaParam>>(&impl_->params);
  if (cuda == nullptr) return out;
  for (size_t i = 0; i < impl_->in_place.size() && i < cuda->size(); ++i) {
    const CudaParam& p = (*cuda)[i];
    out.push_back({p.name, p.dtype, p.shape, reinterpret_cast<const void*>(static_cast<uintptr_t>(impl_->in_place[i].ptr))});
  }
  return out;
}

absl::StatusOr<bool> EngineAgent::Wake(std::vector<ShmParam> params) {
  return WakeAny(Params(std::move(params)), std::nullopt, 0);
}

absl::StatusOr<bool> EngineAgent::Wake(std::vector<CudaParam> params) {
  return WakeAny(Params(std::move(params)), std::nullopt, 0);
}

absl::StatusOr<bool> EngineAgent::Wake(std::vector<DevicePtrParam> params) {
  absl::StatusOr<InPlaceExport> exported = ExportInPlace(params);
  if (!exported.ok()) return exported.status();
  return WakeAny(Params(std::move(exported->params)), std::move(exported->records), exported->allocations);
}

EngineAgent::~EngineAgent() {
  {
    auto signal = impl_->stop.lockExclusive();
    signal->requested = true;
    if (signal->fulfiller.get() != nullptr) signal->fulfiller->fulfill();
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace refit::client
