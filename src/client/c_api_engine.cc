// The C ABI's engine side (c_api.h): an engine agent started over the engine's parameters (in
// shared memory, by CUDA IPC handle or in place), its state, and its sleep and wake.
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/c_api.h"
#include "client/c_api_internal.h"
#include "client/engine_agent.h"
#include "common/dtype.h"

using refit::DType;
using refit::Shape;
using refit::client::c_api::Guard;
using refit::client::c_api::Owner;
using refit::client::c_api::ParseDTypeField;
using refit::client::c_api::ReadElement;
using refit::client::c_api::ReadStruct;
using refit::client::c_api::ShapeField;

struct refit_engine {
  std::unique_ptr<refit::client::EngineAgent> impl;
};

namespace {

// An engine's refit_engine_param array, by storage kind.
struct EngineParams {
  std::vector<refit::client::ShmParam> shm;
  std::vector<refit::client::CudaParam> cuda;
  std::vector<refit::client::DevicePtrParam> ptr;
};

absl::Status ReadEngineParams(const refit_engine_param* params, uint64_t num_params, EngineParams* out) {
  for (uint64_t i = 0; i < num_params; ++i) {
    refit_engine_param p;
    if (absl::Status st = ReadElement(params, num_params, i, "params", &p); !st.ok()) return st;
    if (p.name == nullptr) return absl::InvalidArgumentError(absl::StrCat("params[", i, "].name is NULL"));
    const std::string owner = Owner("engine parameter", p.name);
    absl::StatusOr<DType> dtype = ParseDTypeField(p.dtype, owner);
    if (!dtype.ok()) return dtype.status();
    absl::StatusOr<Shape> shape = ShapeField(p.shape, p.rank, owner);
    if (!shape.ok()) return shape.status();
    if (p.storage == REFIT_STORAGE_CUDA_IPC) {
      refit::client::CudaParam c{p.name, *dtype, std::move(*shape), {}, p.offset, p.cuda_device, nullptr};
      std::memcpy(c.ipc_handle.data(), p.cuda_ipc_handle, c.ipc_handle.size());
      out->cuda.push_back(std::move(c));
      continue;
    }
    if (p.storage == REFIT_STORAGE_CUDA_PTR) {
      if (p.cuda_ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(owner, ": cuda_ptr is NULL"));
      out->ptr.push_back({p.name, *dtype, std::move(*shape), p.cuda_ptr});
      continue;
    }
    if (p.storage != REFIT_STORAGE_SHM) {
      return absl::InvalidArgumentError(absl::StrCat(owner, ": unknown storage kind ", p.storage));
    }
    if (p.shm_name == nullptr || p.shm_name[0] == '\0') {
      return absl::InvalidArgumentError(absl::StrCat(owner, ": shm_name is empty"));
    }
    out->shm.push_back({p.name, *dtype, std::move(*shape), p.shm_name, p.offset});
  }
  return absl::OkStatus();
}

}  // namespace

extern "C" {

int refit_engine_start(const refit_engine_options* options, const refit_engine_param* params, uint64_t num_params,
                       refit_engine** out) {
  return Guard("refit_engine_start", [&]() -> absl::Status {
    if (out == nullptr) return absl::InvalidArgumentError("out is NULL");
    *out = nullptr;
    refit_engine_options o;
    if (absl::Status st = ReadStruct(options, "options", &o); !st.ok()) return st;
    if (o.address == nullptr) return absl::InvalidArgumentError("options.address is NULL");
    EngineParams parsed;
    if (absl::Status st = ReadEngineParams(params, num_params, &parsed); !st.ok()) return st;
    std::vector<refit::client::ShmParam>& shm = parsed.shm;
    std::vector<refit::client::CudaParam>& cuda = parsed.cuda;
    refit::client::EngineCallbacks callbacks;
    if (o.pause != nullptr) callbacks.pause = [fn = o.pause, user = o.user]() { fn(user); };
    if (o.resume != nullptr) callbacks.resume = [fn = o.resume, user = o.user](uint64_t v) { fn(user, v); };
    if (o.resume_tagged != nullptr) {
      callbacks.resume_tagged = [fn = o.resume_tagged, user = o.user](uint64_t v, const std::string& tag) {
        fn(user, v, tag.c_str());
      };
    }
    if (o.audit != nullptr) {
      callbacks.audit = [fn = o.audit, user = o.user]() {
        std::vector<char> buf(1 << 16);
        const uint64_t n = fn(user, buf.data(), buf.size());
        buf.back() = '\0';
        std::vector<std::string> names;
        if (n == 0) return names;
        std::string all(buf.data());
        for (size_t start = 0; start <= all.size();) {
          size_t end = all.find('\n', start);
          if (end == std::string::npos) end = all.size();
          if (end > start) names.push_back(all.substr(start, end - start));
          start = end + 1;
        }
        if (names.empty()) names.push_back("(unnamed)");
        return names;
      };
    }
    refit::client::EngineRank rank;
    rank.tp_rank = o.tp_rank;
    rank.tp_size = o.tp_size;
    rank.ep_rank = o.ep_rank;
    rank.ep_size = o.ep_size;
    rank.device = cuda.empty() && parsed.ptr.empty() ? -1 : o.device;
    rank.model = o.model != nullptr ? o.model : "";
    if (rank.tp_size < 0 || rank.ep_size < 0 || rank.tp_rank < 0 || rank.ep_rank < 0) {
      return absl::InvalidArgumentError("options: tp_rank, tp_size, ep_rank and ep_size must not be negative");
    }
    std::string tag = o.tag != nullptr ? o.tag : "";
    const int kinds = !shm.empty() + !cuda.empty() + !parsed.ptr.empty();
    if (kinds > 1) {
      return absl::InvalidArgumentError(
          "an engine registers all parameters in shared memory or all in CUDA memory (all by IPC handle or all in "
          "place)");
    }
    auto agent = !cuda.empty() ? refit::client::EngineAgent::Start(o.address, std::move(cuda), std::move(callbacks),
                                                                   o.version, false, std::move(tag), std::move(rank))
                 : !parsed.ptr.empty()
                     ? refit::client::EngineAgent::Start(o.address, std::move(parsed.ptr), std::move(callbacks),
                                                         o.version, false, std::move(tag), std::move(rank))
                     : refit::client::EngineAgent::Start(o.address, std::move(shm), std::move(callbacks), o.version,
                                                         false, std::move(tag), std::move(rank));
    if (!agent.ok()) return agent.status();
    auto e = std::make_unique<refit_engine>();
    e->impl = std::move(*agent);
    *out = e.release();
    return absl::OkStatus();
  });
}

uint64_t refit_engine_version(const refit_engine* engine) { return engine == nullptr ? 0 : engine->impl->version(); }
int refit_engine_tag(const refit_engine* engine, char* out, uint64_t out_size) {
  return Guard("refit_engine_tag", [&]() -> absl::Status {
    if (engine == nullptr) return absl::InvalidArgumentError("engine is NULL");
    if (out == nullptr) return absl::InvalidArgumentError("out is NULL");
    const std::string tag = engine->impl->tag();
    if (out_size < tag.size() + 1) {
      return absl::OutOfRangeError(absl::StrCat("the tag needs ", tag.size() + 1, " bytes; out_size is ", out_size));
    }
    std::memcpy(out, tag.c_str(), tag.size() + 1);
    return absl::OkStatus();
  });
}

int32_t refit_engine_paused(const refit_engine* engine) { return engine != nullptr && engine->impl->paused() ? 1 : 0; }
int32_t refit_engine_dirty(const refit_engine* engine) { return engine != nullptr && engine->impl->dirty() ? 1 : 0; }
int32_t refit_engine_connected(const refit_engine* engine) {
  return engine != nullptr && engine->impl->connected() ? 1 : 0;
}

int refit_engine_sleep(refit_engine* engine) {
  return Guard("refit_engine_sleep", [&]() -> absl::Status {
    if (engine == nullptr) return absl::InvalidArgumentError("engine is NULL");
    return engine->impl->Sleep();
  });
}

int refit_engine_wake(refit_engine* engine, const refit_engine_param* params, uint64_t num_params, int32_t* committed) {
  return Guard("refit_engine_wake", [&]() -> absl::Status {
    if (engine == nullptr) return absl::InvalidArgumentError("engine is NULL");
    if (committed != nullptr) *committed = 0;
    absl::StatusOr<bool> woke = absl::InternalError("unreachable");
    if (params == nullptr || num_params == 0) {
      woke = engine->impl->Wake();
    } else {
      EngineParams parsed;
      if (absl::Status st = ReadEngineParams(params, num_params, &parsed); !st.ok()) return st;
      const int kinds = !parsed.shm.empty() + !parsed.cuda.empty() + !parsed.ptr.empty();
      if (kinds > 1) {
        return absl::InvalidArgumentError(
            "an engine registers all parameters in shared memory or all in CUDA memory (all by IPC handle or all in "
            "place)");
      }
      woke = !parsed.cuda.empty()  ? engine->impl->Wake(std::move(parsed.cuda))
             : !parsed.ptr.empty() ? engine->impl->Wake(std::move(parsed.ptr))
                                   : engine->impl->Wake(std::move(parsed.shm));
    }
    if (!woke.ok()) return woke.status();
    if (committed != nullptr) *committed = *woke ? 1 : 0;
    return absl::OkStatus();
  });
}

int32_t refit_engine_asleep(const refit_engine* engine) { return engine != nullptr && engine->impl->asleep() ? 1 : 0; }

uint64_t refit_engine_allocations(const refit_engine* engine) {
  return engine == nullptr ? 0 : engine->impl->allocations();
}

void refit_engine_stop(refit_engine* engine) {
  if (engine == nullptr) return;
  (void)Guard("refit_engine_stop", [&]() -> absl::Status {
    engine->impl.reset();
    return absl::OkStatus();
  });
  delete engine;
}

}  // extern "C"
