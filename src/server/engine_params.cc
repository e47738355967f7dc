#include "server/engine_params.h"

#include <fcntl.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "capnp/capability.h"
#include "common/fd_passing.h"
#include "proto/wire.h"

namespace refit::server {
namespace {

absl::Status Refuse(const std::string& name, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("engine parameter '", name, "': ", why));
}

// refitd's own descriptor of the allocation `fd` carries, or why there is none.
absl::StatusOr<UniqueFd> TakeFd(proto::SharedFd::Client cap, const std::string& name) {
  // The descriptor arrived with the message that carried the capability, so it is known at once
  // (a capability still resolving would carry none).
  kj::Maybe<int> fd = capnp::ClientHook::from(kj::mv(cap))->getFd();
  KJ_IF_MAYBE(f, fd) {
    int own = fcntl(*f, F_DUPFD_CLOEXEC, 0);
    if (own < 0) {
      return absl::ResourceExhaustedError(absl::StrCat("engine parameter '", name, "': duplicating its file descriptor: ",
                                                       std::strerror(errno)));
    }
    return UniqueFd(own);
  }
  return Refuse(name, absl::StrCat("it is in CUDA virtual memory, but its allocation's file descriptor did not arrive: "
                                   "descriptors pass only over a unix: control connection (not TCP or TLS), at most ",
                                   kMaxFdsPerMessage, " in one registration"));
}

}  // namespace

absl::StatusOr<EngineParamList> ReadEngineParams(capnp::List<proto::EngineParam>::Reader list) {
  EngineParamList out;
  std::map<uint32_t, std::shared_ptr<storage::VmmSource>> allocations;
  for (auto p : list) {
    std::string name = wire::Str(p.getName());
    absl::StatusOr<DType> dtype = ParseDType(wire::Str(p.getDtype()));
    if (!dtype.ok()) return Refuse(name, std::string(dtype.status().message()));
    Shape shape;
    for (int64_t d : p.getShape()) shape.push_back(d);
    storage::ParamInfo info{name, *dtype, shape, p.getNbytes()};
    auto storage = p.getStorage();
    switch (storage.which()) {
      case proto::EngineParam::Storage::SHM:
        out.shm.push_back({std::move(info), wire::Str(storage.getShm().getName()), storage.getShm().getOffset()});
        break;
      case proto::EngineParam::Storage::CUDA_IPC: {
        auto c = storage.getCudaIpc();
        storage::CudaIpcParam cp{std::move(info), {}, c.getOffset(), c.getDevice(), nullptr};
        if (c.getHandle().size() != cp.handle.size()) {
          return Refuse(name, absl::StrCat("CUDA IPC handle of ", c.getHandle().size(), " bytes (expected ",
                                           cp.handle.size(), ")"));
        }
        std::memcpy(cp.handle.data(), c.getHandle().begin(), cp.handle.size());
        out.cuda.push_back(std::move(cp));
        break;
      }
      case proto::EngineParam::Storage::CUDA_VMM: {
        auto v = storage.getCudaVmm();
        auto it = allocations.find(v.getAllocation());
        if (it == allocations.end()) {
          auto source = std::make_shared<storage::VmmSource>();
          source->size = v.getSize();
          source->device = v.getDevice();
          if (v.hasFd()) {
            absl::StatusOr<UniqueFd> fd = TakeFd(v.getFd(), name);
            if (!fd.ok()) return fd.status();
            source->pieces.push_back({std::move(*fd), v.getSize()});
          } else if (v.hasPieces() && v.getPieces().size() > 0) {
            // A run of pieces: their sizes must add up to the allocation's, overflow-checked.
            uint64_t sum = 0;
            for (auto piece : v.getPieces()) {
              if (!piece.hasFd()) return Refuse(name, "a piece of its CUDA virtual-memory allocation carries no file descriptor");
              if (piece.getSize() == 0 || piece.getSize() > UINT64_MAX - sum) {
                return Refuse(name, "its CUDA virtual-memory allocation's pieces have unusable sizes");
              }
              sum += piece.getSize();
              absl::StatusOr<UniqueFd> fd = TakeFd(piece.getFd(), name);
              if (!fd.ok()) return fd.status();
              source->pieces.push_back({std::move(*fd), piece.getSize()});
            }
            if (sum != v.getSize()) {
              return Refuse(name, absl::StrCat("the pieces of its CUDA virtual-memory allocation add up to ", sum,
                                               " bytes, not its ", v.getSize()));
            }
          } else {
            return Refuse(name, absl::StrCat("the first parameter of CUDA virtual-memory allocation ", v.getAllocation(),
                                             " carries no file descriptor"));
          }
          it = allocations.emplace(v.getAllocation(), std::move(source)).first;
        } else if (it->second->size != v.getSize() || it->second->device != v.getDevice()) {
          return Refuse(name, absl::StrCat("CUDA virtual-memory allocation ", v.getAllocation(), " is ", v.getSize(),
                                           " bytes on device ", v.getDevice(), " here, but ", it->second->size,
                                           " bytes on device ", it->second->device, " for an earlier parameter"));
        }
        const uint64_t size = it->second->size;
        if (v.getOffset() > size || p.getNbytes() > size - v.getOffset()) {
          return Refuse(name, absl::StrCat("[", v.getOffset(), ", +", p.getNbytes(),
                                           ") lies outside its CUDA virtual-memory mapping of ", size, " bytes"));
        }
        out.cuda.push_back({std::move(info), {}, v.getOffset(), v.getDevice(), it->second});
        break;
      }
      default:
        return Refuse(name, "storage of a kind this refitd does not know (a newer engine agent?)");
    }
  }
  return out;
}

}  // namespace refit::server
