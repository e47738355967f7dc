#include "client/trainer_client.h"

#include "common/control_connect.h"

#include <cstring>
#include <future>

#include "absl/strings/str_cat.h"
#include "capnp/rpc-twoparty.h"
#include "common/checksum.h"
#include "kj/async-io.h"
#include "proto/refit.capnp.h"
#include "proto/wire.h"
#include "transport/ucx/ucx_sender.h"
#if REFIT_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "transport/nccl/nccl_sender.h"
#endif

namespace refit::client {
namespace {

// A remote failure as an absl::Status carrying refitd's own message.
absl::Status FromException(const kj::Exception& e) {
  std::string msg = e.getDescription().cStr();
  constexpr std::string_view kPrefix = "remote exception: ";
  if (msg.rfind(kPrefix, 0) == 0) msg = msg.substr(kPrefix.size());
  if (e.getType() == kj::Exception::Type::DISCONNECTED) {
    return absl::UnavailableError(absl::StrCat("refitd disconnected: ", msg, TlsDisconnectHint(msg)));
  }
  if (msg.rfind("refit refused", 0) == 0 || msg.rfind("manifest refused", 0) == 0) return absl::FailedPreconditionError(msg);
  if (msg.rfind("busy", 0) == 0) return absl::UnavailableError(msg);
  return absl::AbortedError(msg);
}

template <typename F>
auto Call(F&& f) -> absl::StatusOr<decltype(f())> {
  absl::StatusOr<decltype(f())> out = absl::UnknownError("no result");
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { out = f(); })) { return FromException(*e); }
  return out;
}

}  // namespace

struct TrainerClient::Impl {
  kj::AsyncIoContext io = kj::setupAsyncIo();
  kj::Own<kj::AsyncIoStream> conn;
  kj::Own<capnp::TwoPartyClient> rpc;
  proto::Daemon::Client daemon = nullptr;
  std::unique_ptr<transport::Sender> sender;
  std::string sender_endpoint;
  // NCCL data plane: buckets are packed on the GPU with asynchronous copies on copy_stream into
  // one of two device buffers (bucket_bytes each) while the other one's bucket is being sent.
  bool device_buckets = false;
  int device = 0;
  void* device_bucket[2] = {nullptr, nullptr};
  int current = 0;  // the buffer Push packs into
  uint64_t device_bucket_bytes = 0;
  void* copy_stream = nullptr;

  ~Impl() {
#if REFIT_HAVE_NCCL
    sender.reset();
    cudaSetDevice(device);
    if (copy_stream != nullptr) {
      cudaStreamSynchronize(static_cast<cudaStream_t>(copy_stream));
      cudaStreamDestroy(static_cast<cudaStream_t>(copy_stream));
    }
    for (void* b : device_bucket) {
      if (b != nullptr) cudaFree(b);
    }
#endif
  }
  // Connects the data plane named by refitd's endpoint (ucx:... or nccl:...).
  absl::Status ConnectData(const std::string& endpoint, uint64_t bucket_bytes);
};

absl::Status TrainerClient::Impl::ConnectData(const std::string& endpoint, uint64_t bucket_bytes) {
  if (!sender || sender_endpoint != endpoint) {
    sender.reset();
    if (endpoint.rfind("nccl:", 0) == 0) {
#if REFIT_HAVE_NCCL
      // The trainer's current CUDA device sends (it must differ from refitd's device).
      if (cudaGetDevice(&device) != cudaSuccess) return absl::UnavailableError("NCCL data plane: no CUDA device");
      transport::NcclOptions options;
      options.device = device;
      absl::StatusOr<std::unique_ptr<transport::NcclSender>> s = transport::NcclSender::Connect(endpoint, options);
      if (!s.ok()) return s.status();
      sender = std::move(*s);
      device_buckets = true;
#else
      return absl::UnimplementedError(
          absl::StrCat("refitd offers the NCCL data plane (", endpoint, ") but this client was built without NCCL"));
#endif
    } else {
      absl::StatusOr<std::unique_ptr<transport::UcxSender>> s = transport::UcxSender::Connect(endpoint, {});
      if (!s.ok()) return s.status();
      sender = std::move(*s);
      device_buckets = false;
    }
    sender_endpoint = endpoint;
  }
#if REFIT_HAVE_NCCL
  if (device_buckets && device_bucket_bytes < bucket_bytes) {
    cudaSetDevice(device);
    for (void*& b : device_bucket) {
      if (b != nullptr) cudaFree(b);
      b = nullptr;
    }
    device_bucket_bytes = 0;
    for (void*& b : device_bucket) {
      if (cudaMalloc(&b, bucket_bytes) != cudaSuccess) {
        b = nullptr;
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate two ", bucket_bytes, "-byte device buckets"));
      }
    }
    device_bucket_bytes = bucket_bytes;
    if (copy_stream == nullptr) {
      cudaStream_t s = nullptr;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        return absl::UnavailableError("cannot create a CUDA stream");
      }
      copy_stream = s;
    }
  }
#endif
  return absl::OkStatus();
}

struct RefitSession::Impl {
  TrainerClient::Impl* client;
  proto::Session::Client session = nullptr;
  uint64_t id = 0;
  uint64_t bucket_bytes = 0;
  std::vector<uint8_t> bucket;
  uint64_t device_used = 0;  // bytes packed into the client's device bucket (NCCL)
  std::future<absl::Status> in_flight;  // the previous device bucket's send (NCCL)
  // Waits for the previous device bucket's send; its error, if any.
  absl::Status WaitInFlight() { return in_flight.valid() ? in_flight.get() : absl::OkStatus(); }
  BucketHeader header;
  bool member = false;  // joined another rank's session
  bool done = false;
  std::function<void(uint32_t, std::vector<uint8_t>&)> tamper;
};

TrainerClient::TrainerClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TrainerClient::~TrainerClient() = default;

absl::StatusOr<std::unique_ptr<TrainerClient>> TrainerClient::Connect(const std::string& address) {
  auto impl = std::make_unique<Impl>();
  absl::StatusOr<ControlClientOptions> options = ControlClientOptionsFromEnv();
  if (!options.ok()) return options.status();
  absl::StatusOr<kj::Own<kj::AsyncIoStream>> conn =
      ConnectControl(impl->io.provider->getNetwork(), impl->io.waitScope, address, *options);
  if (!conn.ok()) {
    return absl::Status(conn.status().code(),
                        absl::StrCat("cannot connect to refitd at '", address, "': ", conn.status().message()));
  }
  impl->conn = kj::mv(*conn);
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    impl->rpc = kj::heap<capnp::TwoPartyClient>(*impl->conn);
    impl->daemon = impl->rpc->bootstrap().castAs<proto::Daemon>();
  })) {
    return absl::UnavailableError(absl::StrCat("cannot connect to refitd at '", address, "': ", e->getDescription().cStr()));
  }
  return std::unique_ptr<TrainerClient>(new TrainerClient(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<RefitSession>> TrainerClient::Begin(const Manifest& manifest) {
  auto s = std::make_unique<RefitSession::Impl>();
  s->client = impl_.get();
  std::string endpoint;
  absl::StatusOr<bool> ok = Call([&]() {
    auto req = impl_->daemon.beginRequest();
    wire::ToWire(manifest, req.initManifest());
    auto resp = req.send().wait(impl_->io.waitScope);
    s->session = resp.getSession();
    s->id = resp.getSessionId();
    s->bucket_bytes = resp.getBucketBytes();
    endpoint = resp.getDataEndpoint().cStr();
    return true;
  });
  if (!ok.ok()) return ok.status();
  if (absl::Status st = impl_->ConnectData(endpoint, s->bucket_bytes); !st.ok()) {
    auto req = s->session.abortRequest();
    req.setReason(absl::StrCat("trainer could not connect the data plane: ", st.message()));
    (void)Call([&]() {
      req.send().wait(impl_->io.waitScope);
      return true;
    });
    return st;
  }
  return std::make_unique<RefitSession>(std::move(s));
}

absl::StatusOr<std::unique_ptr<RefitSession>> TrainerClient::Join(uint64_t session_id) {
  auto s = std::make_unique<RefitSession::Impl>();
  s->client = impl_.get();
  s->id = session_id;
  s->member = true;
  std::string endpoint;
  absl::StatusOr<bool> ok = Call([&]() {
    auto req = impl_->daemon.joinRequest();
    req.setSessionId(session_id);
    auto resp = req.send().wait(impl_->io.waitScope);
    s->session = resp.getSession();
    s->bucket_bytes = resp.getBucketBytes();
    endpoint = resp.getDataEndpoint().cStr();
    return true;
  });
  if (!ok.ok()) return ok.status();
  if (absl::Status st = impl_->ConnectData(endpoint, s->bucket_bytes); !st.ok()) return st;
  return std::make_unique<RefitSession>(std::move(s));
}

absl::StatusOr<DaemonStatus> TrainerClient::Status() {
  return Call([&]() {
    auto resp = impl_->daemon.statusRequest().send().wait(impl_->io.waitScope);
    auto r = resp.getStatus();
    DaemonStatus s;
    s.model = r.getModel().cStr();
    s.engine_registered = r.getEngineRegistered();
    s.engine_params = r.getEngineParams();
    s.engine_bytes = r.getEngineBytes();
    s.version = r.getVersion();
    s.active_session = r.getActiveSession();
    s.staging_bytes = r.getStagingBytes();
    s.staging_limit_bytes = r.getStagingLimitBytes();
    s.ring_bytes = r.getRingBytes();
    s.ring_on_device = r.getRingOnDevice();
    s.committed = r.getCommitted();
    s.refused = r.getRefused();
    s.aborted = r.getAborted();
    s.data_endpoint = r.getDataEndpoint().cStr();
    s.last_report = wire::FromWire(r.getLastReport());
    return s;
  });
}

absl::StatusOr<bool> TrainerClient::AbortActive(const std::string& reason) {
  return Call([&]() {
    auto req = impl_->daemon.abortActiveRequest();
    req.setReason(reason);
    return req.send().wait(impl_->io.waitScope).getAborted();
  });
}

absl::StatusOr<std::pair<uint64_t, std::vector<ParamChecksum>>> TrainerClient::Checksums() {
  return Call([&]() {
    auto resp = impl_->daemon.checksumsRequest().send().wait(impl_->io.waitScope);
    std::vector<ParamChecksum> out;
    for (auto p : resp.getParams()) out.push_back({p.getName().cStr(), p.getChecksum(), p.getNbytes()});
    return std::make_pair(static_cast<uint64_t>(resp.getVersion()), std::move(out));
  });
}

RefitSession::RefitSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RefitSession::~RefitSession() {
  if (!impl_->done) (void)Abort("trainer closed the session without committing");
}

void RefitSession::SetWireTamper(std::function<void(uint32_t, std::vector<uint8_t>&)> tamper) {
  impl_->tamper = std::move(tamper);
}

uint64_t RefitSession::id() const { return impl_->id; }
uint64_t RefitSession::bucket_bytes() const { return impl_->bucket_bytes; }

absl::Status RefitSession::Push(const TensorRef& t) {
  if (impl_->done) return absl::FailedPreconditionError("session already ended");
  absl::StatusOr<uint64_t> nbytes = DenseBytes(t.dtype, t.shape);
  if (!nbytes.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", nbytes.status().message()));
  if (*nbytes > impl_->bucket_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' is ", *nbytes, " bytes, larger than the ",
                                                   impl_->bucket_bytes, "-byte bucket"));
  }
  TrainerClient::Impl* client = impl_->client;
  const uint64_t used = client->device_buckets ? impl_->device_used : impl_->bucket.size();
  // Keep 16-byte alignment of every tensor inside the bucket.
  uint64_t offset = (used + 15) & ~uint64_t{15};
  if (offset + *nbytes > impl_->bucket_bytes) {
    absl::Status st = Flush();
    if (!st.ok()) return st;
    offset = 0;
  }
  if (client->device_buckets) {
#if REFIT_HAVE_NCCL
    // Host or device source; the copy runs on the client's stream and completes before the send.
    cudaError_t e = cudaMemcpyAsync(static_cast<uint8_t*>(client->device_bucket[client->current]) + offset, t.data, *nbytes,
                                    cudaMemcpyDefault, static_cast<cudaStream_t>(client->copy_stream));
    if (e != cudaSuccess) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': copy into the device bucket failed: ", cudaGetErrorString(e)));
    }
    impl_->device_used = offset + *nbytes;
#endif
  } else {
    impl_->bucket.resize(offset + *nbytes);
    std::memcpy(impl_->bucket.data() + offset, t.data, *nbytes);
  }
  impl_->header.tensors.push_back({t.name, t.dtype, t.shape, offset, *nbytes, t.slice});
  return absl::OkStatus();
}

absl::Status RefitSession::Flush() {
  if (impl_->header.tensors.empty()) return absl::OkStatus();
  BucketHeader& h = impl_->header;
  auto* client = impl_->client;
  const void* payload = impl_->bucket.data();
  h.seq = kAssignBucketSeq;  // refitd numbers buckets (several ranks may push into one session)
  if (client->device_buckets) {
#if REFIT_HAVE_NCCL
    cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(client->copy_stream));
    if (e != cudaSuccess) return absl::InternalError(absl::StrCat("packing the device bucket: ", cudaGetErrorString(e)));
#endif
    h.nbytes = impl_->device_used;
    h.checksum = 0;  // device buckets are not checksummed (NCCL's transports check integrity)
    payload = client->device_bucket[client->current];
  } else {
    h.nbytes = impl_->bucket.size();
    h.checksum = Checksum64(impl_->bucket.data(), impl_->bucket.size());
  }
  absl::StatusOr<bool> ok = Call([&]() {
    auto req = impl_->session.announceRequest();
    wire::ToWire(h, req.initHeader());
    h.seq = req.send().wait(client->io.waitScope).getSeq();
    return true;
  });
  if (!ok.ok()) return ok.status();
  if (impl_->tamper && !client->device_buckets) {
    impl_->tamper(h.seq, impl_->bucket);
    payload = impl_->bucket.data();
  }
  const uint64_t tag = (impl_->id << 32) | h.seq;
  absl::Status sent;
  if (client->device_buckets) {
    // Send in the background from this buffer while the next bucket is packed into the other.
    sent = impl_->WaitInFlight();
    if (sent.ok()) {
      transport::Sender* sender = client->sender.get();
      const uint64_t n = h.nbytes;
      impl_->in_flight = std::async(std::launch::async, [sender, tag, payload, n] { return sender->Send(tag, payload, n); });
      client->current ^= 1;
    }
  } else {
    sent = client->sender->Send(tag, payload, h.nbytes);
    if (!sent.ok()) {
      // refitd dropped the data-plane connection (the session was aborted) or it failed: the
      // next session connects afresh.
      client->sender.reset();
      client->sender_endpoint.clear();
    }
  }
  impl_->bucket.clear();
  impl_->device_used = 0;
  h.tensors.clear();
  return sent;
}

absl::StatusOr<RefitReport> RefitSession::Commit() {
  absl::Status st = Flush();
  if (absl::Status last = impl_->WaitInFlight(); st.ok()) st = last;
  if (!st.ok()) return st;
  impl_->done = true;
  return Call([&]() {
    auto resp = impl_->session.commitRequest().send().wait(impl_->client->io.waitScope);
    return wire::FromWire(resp.getReport());
  });
}

absl::Status RefitSession::Detach() {
  absl::Status st = Flush();
  if (absl::Status last = impl_->WaitInFlight(); st.ok()) st = last;
  if (!st.ok()) return st;
  impl_->done = true;
  absl::StatusOr<bool> ok = Call([&]() {
    impl_->session.detachRequest().send().wait(impl_->client->io.waitScope);
    return true;
  });
  return ok.status();
}

absl::Status RefitSession::Abort(const std::string& reason) {
  impl_->done = true;
  (void)impl_->WaitInFlight();
  absl::StatusOr<bool> ok = Call([&]() {
    auto req = impl_->session.abortRequest();
    req.setReason(reason);
    req.send().wait(impl_->client->io.waitScope);
    return true;
  });
  return ok.status();
}

}  // namespace refit::client
