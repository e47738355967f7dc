#include <memory>
#include <string>
#include <vector>

#include "client/trainer_client_internal.h"

namespace refit::client {

std::shared_ptr<ThreadIo> AcquireThreadIo() {
  thread_local std::weak_ptr<ThreadIo> current;
  std::shared_ptr<ThreadIo> io = current.lock();
  if (io == nullptr) {
    io = std::make_shared<ThreadIo>();
    current = io;
  }
  return io;
}

absl::Status DataPlane::Connect(const std::vector<std::string>& want, bool fanout, uint64_t bucket_bytes) {
  const transport::TransportDescriptor* t = transports.FindByEndpoint(want.front());
  if (t == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("refitd offers the data plane '", want.front(),
                     "' but this client was built without its transport (built in: ", transports.Names(), ")"));
  }
  for (const std::string& e : want) {
    if (transports.FindByEndpoint(e) != t) {
      return absl::InvalidArgumentError(
          absl::StrCat("fan-out needs one data plane on every daemon; got '", want.front(), "' and '", e, "'"));
    }
  }
  const bool connected = fanout ? group != nullptr : sender != nullptr;
  if (!connected || endpoints != want) {
    Drop();
    config = transport::ConnectConfig{};
    if (t->payload_memory == storage::MemoryKind::kDevice) {
      absl::StatusOr<int> device = storage::CurrentDevice();
      if (!device.ok()) return absl::UnavailableError(absl::StrCat(t->name, " data plane: no CUDA device"));
      config.device = *device;
    }
    if (fanout) {
      absl::StatusOr<std::unique_ptr<transport::GroupSender>> g = transport::ConnectGroup(*t, want, config);
      if (!g.ok()) return g.status();
      group = std::move(*g);
    } else {
      absl::StatusOr<std::unique_ptr<transport::Sender>> s = t->connect(want.front(), config);
      if (!s.ok()) return s.status();
      sender = std::move(*s);
    }
    if (absl::Status st = UseMemory(*t, config.device); !st.ok()) return st;
    endpoints = want;
  }
  return ReserveBuckets(bucket_bytes);
}

absl::Status DataPlane::UseMemory(const transport::TransportDescriptor& t, int device) {
  const bool on_device = t.payload_memory == storage::MemoryKind::kDevice;
  if (memory != nullptr && memory->kind() == t.payload_memory && (!on_device || memory_device == device)) {
    transport = &t;
    return absl::OkStatus();
  }
  if (memory != nullptr) (void)memory->Synchronize();
  bucket[0].reset();
  bucket[1].reset();
  bucket_capacity = 0;
  current = 0;
  memory.reset();
  transport = nullptr;
  if (on_device) {
    absl::StatusOr<std::unique_ptr<storage::Memory>> m = t.bucket_memory(device);
    if (!m.ok()) return m.status();
    memory = std::move(*m);
  } else {
    // Plain host memory: the trainer's buckets need not be page-locked (refitd's ring is).
    memory = storage::NewHostMemory();
  }
  memory_device = device;
  transport = &t;
  return absl::OkStatus();
}

absl::Status DataPlane::ReserveBuckets(uint64_t bucket_bytes) {
  if (bucket_capacity >= bucket_bytes) return absl::OkStatus();
  if (absl::Status st = memory->Synchronize(); !st.ok()) return st;
  bucket[0].reset();
  bucket[1].reset();
  bucket_capacity = 0;
  current = 0;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::shared_ptr<uint8_t>> b = memory->Allocate(bucket_bytes);
    if (!b.ok()) {
      bucket[0].reset();
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate the ", bucket_bytes, "-byte buckets: ", b.status().message()));
    }
    bucket[i] = std::move(*b);
  }
  bucket_capacity = bucket_bytes;
  return absl::OkStatus();
}

}  // namespace refit::client
