#include "client/engine_agent.h"

#include "common/control_connect.h"

#include <future>

#include "absl/strings/str_cat.h"
#include "capnp/rpc-twoparty.h"
#include "kj/async-io.h"
#include "kj/mutex.h"
#include "proto/refit.capnp.h"
#include "proto/wire.h"

namespace refit::client {

struct EngineAgent::Impl {
  std::promise<absl::Status> registered;
  kj::MutexGuarded<kj::Own<const kj::Executor>> executor;
  kj::Own<kj::PromiseFulfiller<void>> stop;  // touched only on the agent thread
  bool stopping = false;                     // agent thread only
};

namespace {

class ControlImpl final : public proto::EngineControl::Server {
 public:
  ControlImpl(EngineCallbacks& cb, std::atomic<uint64_t>& version, std::mutex& tag_mu, std::string& tag,
              std::atomic<bool>& paused, std::atomic<bool>& dirty)
      : cb_(cb), version_(version), tag_mu_(tag_mu), tag_(tag), paused_(paused), dirty_(dirty) {}

 protected:
  kj::Promise<void> pause(PauseContext) override {
    if (!paused_.load()) {
      if (cb_.pause) cb_.pause();
      paused_ = true;
    }
    dirty_ = true;  // from here until resume, the parameters may hold a mix of versions
    return kj::READY_NOW;
  }
  kj::Promise<void> resume(ResumeContext context) override {
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
};

}  // namespace

absl::StatusOr<std::unique_ptr<EngineAgent>> EngineAgent::Start(const std::string& address, std::vector<ShmParam> params,
                                                                EngineCallbacks callbacks, uint64_t version,
                                                                bool reconnect, std::string tag, EngineRank rank) {
  return StartAny(address, std::move(params), std::move(callbacks), version, reconnect, std::move(tag),
                  std::move(rank));
}

absl::StatusOr<std::unique_ptr<EngineAgent>> EngineAgent::Start(const std::string& address, std::vector<CudaParam> params,
                                                                EngineCallbacks callbacks, uint64_t version,
                                                                bool reconnect, std::string tag, EngineRank rank) {
  return StartAny(address, std::move(params), std::move(callbacks), version, reconnect, std::move(tag),
                  std::move(rank));
}

absl::StatusOr<std::unique_ptr<EngineAgent>> EngineAgent::StartAny(const std::string& address, Params params,
                                                                   EngineCallbacks callbacks, uint64_t version,
                                                                   bool reconnect, std::string tag, EngineRank rank) {
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

void EngineAgent::Run(std::string address, Params params) {
  bool reported = false;
  auto report = [&](absl::Status st) {
    if (!reported) impl_->registered.set_value(std::move(st));
    reported = true;
  };
  auto io = kj::setupAsyncIo();
  auto stop = kj::newPromiseAndFulfiller<void>();
  impl_->stop = kj::mv(stop.fulfiller);
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
      capnp::TwoPartyClient rpc(*conn);
      auto daemon = rpc.bootstrap().castAs<proto::Daemon>();
      auto req = daemon.registerEngineRequest();
      auto fill_common = [](auto b, const std::string& name, DType dtype, const Shape& shape) {
        b.setName(name);
        b.setDtype(std::string(DTypeName(dtype)));
        auto s = b.initShape(static_cast<unsigned>(shape.size()));
        for (size_t d = 0; d < shape.size(); ++d) s.set(static_cast<unsigned>(d), shape[d]);
        absl::StatusOr<uint64_t> n = DenseBytes(dtype, shape);
        b.setNbytes(n.ok() ? *n : 0);
      };
      if (auto* shm = std::get_if<std::vector<ShmParam>>(&params)) {
        auto list = req.initParams(static_cast<unsigned>(shm->size()));
        for (size_t i = 0; i < shm->size(); ++i) {
          const ShmParam& p = (*shm)[i];
          auto b = list[static_cast<unsigned>(i)];
          fill_common(b, p.name, p.dtype, p.shape);
          b.getStorage().initShm().setName(p.shm_name);
          b.getStorage().getShm().setOffset(p.offset);
        }
      } else {
        const auto& cuda = std::get<std::vector<CudaParam>>(params);
        auto list = req.initParams(static_cast<unsigned>(cuda.size()));
        for (size_t i = 0; i < cuda.size(); ++i) {
          const CudaParam& p = cuda[i];
          auto b = list[static_cast<unsigned>(i)];
          fill_common(b, p.name, p.dtype, p.shape);
          auto c = b.getStorage().initCudaIpc();
          c.setHandle(kj::arrayPtr(p.ipc_handle.data(), p.ipc_handle.size()));
          c.setOffset(p.offset);
          c.setDevice(p.device);
        }
      }
      req.setControl(kj::heap<ControlImpl>(callbacks_, version_, tag_.mu, tag_.value, paused_, dirty_));
      req.setVersion(version_.load());
      req.setTag(wire::Text(tag()));
      req.setDirty(dirty_.load());
      req.setTpRank(rank_.tp_rank);
      req.setTpSize(rank_.tp_size);
      req.setEpRank(rank_.ep_rank);
      req.setEpSize(rank_.ep_size);
      req.setDevice(rank_.device);
      req.setModel(wire::Text(rank_.model));
      auto resp = req.send().wait(io.waitScope);
      if (absl::Status st = wire::FromWire(resp.getStatus()); !st.ok()) {
        // Refused by refitd (another engine is registered, a parameter it cannot map, a spec
        // mismatch): reported as it is, never retried.
        if (!reported) {
          report(absl::Status(st.code(), absl::StrCat("engine registration with refitd at '", address,
                                                      "' refused: ", st.message())));
        }
        impl_->stopping = true;
        return;
      }
      auto registration = resp.getRegistration();
      connected_ = true;
      ++registrations_;
      report(absl::OkStatus());
      stopped.addBranch().exclusiveJoin(rpc.onDisconnect()).wait(io.waitScope);
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
    connected_ = false;
    if (paused_.load()) dirty_ = true;  // disconnected inside the commit window: weights may be mixed
    if (impl_->stopping || !reconnect_) break;
    // refitd went away: retry until it is back (or Stop).
    stopped.addBranch().exclusiveJoin(io.provider->getTimer().afterDelay(100 * kj::MILLISECONDS)).wait(io.waitScope);
    if (impl_->stopping) break;
  }
  *impl_->executor.lockExclusive() = nullptr;
  impl_->stop = nullptr;
}

EngineAgent::~EngineAgent() {
  kj::Own<const kj::Executor> executor = kj::mv(*impl_->executor.lockExclusive());
  if (executor.get() != nullptr) {
    // Throws DISCONNECTED if the agent's loop already ended (refitd went away first).
    kj::runCatchingExceptions([&]() {
      executor->executeSync([this]() {
        if (impl_->stop) impl_->stop->fulfill();
      });
    });
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace refit::client
