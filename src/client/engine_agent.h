// Engine-side agent: registers the engine's parameters (shared-memory regions) with refitd and
// serves refitd's pause/resume calls on its own thread, so the engine's serving threads never
// block on the control plane.
//
// Contract with the engine (DESIGN.md invariants 1 and 7): `pause` must return only once nothing
// reads the parameters; between pause and resume refitd writes them in place; `resume(v)` says
// they hold version v. If refitd disconnects between pause and resume, the weights may be a mix:
// the agent marks them dirty() and the engine must not serve them until a later resume.
//
// With `reconnect`, the agent outlives refitd: when the connection drops it keeps retrying and
// registers again (with its version and dirty flag) once refitd is back. A dirty engine stays
// paused until refitd lands a full refit and resumes it.
//
// Threading: the public methods are thread-safe. Callbacks run on the agent's thread.
#ifndef REFIT_CLIENT_ENGINE_AGENT_H_
#define REFIT_CLIENT_ENGINE_AGENT_H_

#include <array>
#include <atomic>
#include <variant>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/unique_fd.h"

namespace refit::client {

struct ShmParam {
  std::string name;
  DType dtype;
  Shape shape;
  std::string shm_name;  // POSIX shm object holding it
  uint64_t offset;
};

// CUDA virtual memory (cuMemCreate + cuMemMap) exported as POSIX file descriptors
// (cuMemExportToShareableHandle), shared by the parameters that lie in it: one mapped piece, or a
// run of pieces mapped at consecutive addresses (PyTorch's expandable segments map memory in
// 2 or 20 MiB pieces), one descriptor each. Descriptors pass to refitd only over a unix: control
// connection (common/fd_passing.h); refitd maps bytes [0, size) of each piece, in order.
struct VmmPiece {
  // Closed in place once refitd dropped its mapping (EngineAgent's sleep): the capabilities that
  // carried it to refitd may outlive the registration, and an open descriptor keeps the memory.
  mutable UniqueFd fd;
  uint64_t size = 0;  // bytes of the engine's mapping of it
};
struct VmmAllocation {
  std::vector<VmmPiece> pieces;  // in address order
  uint64_t size = 0;             // their sum
  int device = 0;
};

// A parameter in GPU memory, exported by CUDA IPC: the handle of the allocation holding it
// (cudaIpcGetMemHandle bytes) and its offset inside that allocation; or, with `vmm` set, the
// CUDA virtual-memory allocation holding it and its offset from the start of its mapping.
struct CudaParam {
  std::string name;
  DType dtype;
  Shape shape;
  std::array<uint8_t, 64> ipc_handle;  // unused when `vmm` is set
  uint64_t offset;
  int device;
  std::shared_ptr<const VmmAllocation> vmm;
};

// A parameter registered in place by its device pointer (e.g. a PyTorch tensor's data_ptr()):
// the agent groups parameters by the CUDA allocation holding them and exports one CUDA IPC handle
// per allocation, or one POSIX file descriptor per CUDA virtual-memory allocation
// (client/cuda_export.h). Host and managed memory, and virtual memory that cannot be exported as
// a descriptor, are refused naming the parameter.
struct DevicePtrParam {
  std::string name;
  DType dtype;
  Shape shape;
  const void* ptr;
};

struct InPlaceRecord;  // client/cuda_export.h

struct EngineCallbacks {
  // May come before Start returns: a joining member of an engine group pauses an engine that holds
  // another version than the group's while it registers (docs/architecture.md "Late join"); an
  // engine whose serving loop has not started returns at once and starts paused.
  std::function<void()> pause;
  std::function<void(uint64_t version)> resume;
  // When set, called instead of `resume`, with the trainer's tag of `version` ("" when none).
  std::function<void(uint64_t version, const std::string& tag)> resume_tagged;
  // Before every commit (refitd's registration audit): the names of the registered parameters
  // that are no longer where the engine registered them (e.g. re-pointed at a new tensor). Optional;
  // parameters registered in place are also re-checked against their allocations by the agent.
  std::function<std::vector<std::string>()> audit;
};

// Where this engine process sits in an engine of several ranks (TP/EP workers, one per GPU), as
// it registers with the node's refitd. The default (tp_size 0) is a single engine.
struct EngineRank {
  int tp_rank = 0;
  int tp_size = 0;
  int ep_rank = 0;
  int ep_size = 0;  // 0: no expert parallelism
  int device = -1;  // the CUDA device of its parameters; -1 for host (shm) engines
  std::string model;  // checked against refitd's model when not ""
};

class EngineAgent {
 public:
  // Connects, registers, and returns once refitd accepted the registration (or refused it,
  // naming the parameter).
  static absl::StatusOr<std::unique_ptr<EngineAgent>> Start(const std::string& address, std::vector<ShmParam> params,
                                                            EngineCallbacks callbacks, uint64_t version,
                                                            bool reconnect = false, std::string tag = "",
                                                            EngineRank rank = {});
  // The same for parameters in GPU memory (CUDA IPC, or CUDA virtual memory whose descriptors
  // pass only over a unix: address: over TCP the first such parameter is refused, named; at most
  // kMaxFdsPerMessage mapped pieces). The engine keeps the allocations alive while registered;
  // refitd opens each allocation once per registration.
  static absl::StatusOr<std::unique_ptr<EngineAgent>> Start(const std::string& address, std::vector<CudaParam> params,
                                                            EngineCallbacks callbacks, uint64_t version,
                                                            bool reconnect = false, std::string tag = "",
                                                            EngineRank rank = {});
  // Parameters registered in place from their device pointers (grouped by allocation, one IPC
  // handle each; nothing copied).
  static absl::StatusOr<std::unique_ptr<EngineAgent>> Start(const std::string& address,
                                                            std::vector<DevicePtrParam> params,
                                                            EngineCallbacks callbacks, uint64_t version,
                                                            bool reconnect = false, std::string tag = "",
                                                            EngineRank rank = {});
  ~EngineAgent();

  // Sleep and wake. Sleep: the engine is about to release its weights; returns once refitd has
  // dropped its mappings (Unavailable while a commit is in flight: retry). Wake: the weights are
  // mapped again, the same parameters at the same or new addresses (the overload without
  // arguments: the ones registered last); refitd maps them and commits a refit staged while the
  // engine slept (calling pause/resume meanwhile) before this returns. Returns whether a refit was
  // committed; an error when the wake or that commit failed (the message says which). Parameters
  // registered in place are exported again from their addresses by Wake() (a sleep closes the
  // agent's descriptors of CUDA virtual-memory allocations, so that releasing them frees them).
  absl::Status Sleep();
  absl::StatusOr<bool> Wake();
  absl::StatusOr<bool> Wake(std::vector<ShmParam> params);
  absl::StatusOr<bool> Wake(std::vector<CudaParam> params);
  absl::StatusOr<bool> Wake(std::vector<DevicePtrParam> params);
  bool asleep() const { return asleep_.load(); }
  // Distinct CUDA allocations the parameters registered in place lie in (0 for other storage).
  size_t allocations() const { return allocations_.load(); }

  uint64_t version() const { return version_.load(); }
  // The trainer's tag of version() ("" when none): the one `Start` was given, then each resume's.
  std::string tag() const;
  bool paused() const { return paused_.load(); }
  bool dirty() const { return dirty_.load(); }
  bool connected() const { return connected_.load(); }
  // Registrations so far (1 after Start; more after reconnects).
  uint64_t registrations() const { return registrations_.load(); }

  struct Impl;

 private:
  EngineAgent() = default;
  using Params = std::variant<std::vector<ShmParam>, std::vector<CudaParam>>;
  static absl::StatusOr<std::unique_ptr<EngineAgent>> StartAny(const std::string& address, Params params,
                                                               EngineCallbacks callbacks, uint64_t version,
                                                               bool reconnect, std::string tag, EngineRank rank,
                                                               std::vector<InPlaceRecord> in_place,
                                                               size_t allocations);
  void Run(std::string address, Params params);
  // params: nullopt wakes with the ones registered last; in_place: their in-place records.
  absl::StatusOr<bool> WakeAny(std::optional<Params> params, std::optional<std::vector<InPlaceRecord>> in_place,
                               size_t allocations);
  // Agent thread: after a sleep, closes the descriptors of the CUDA virtual-memory allocations
  // registered last (an open descriptor would keep the released memory allocated).
  void DropDescriptors();
  // Agent thread: the parameters registered in place, as device pointers, to export again.
  std::vector<DevicePtrParam> InPlacePointers() const;

  EngineCallbacks callbacks_;
  std::atomic<uint64_t> version_{0};
  struct Tag {
    mutable std::mutex mu;
    std::string value;
  };
  Tag tag_;
  std::atomic<bool> paused_{false};
  std::atomic<bool> dirty_{false};
  std::atomic<bool> connected_{false};
  std::atomic<uint64_t> registrations_{0};
  std::atomic<bool> asleep_{false};
  std::atomic<size_t> allocations_{0};
  bool reconnect_ = false;
  EngineRank rank_;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace refit::client

#endif  // REFIT_CLIENT_ENGINE_AGENT_H_
