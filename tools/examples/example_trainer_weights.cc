// The example trainer's demo weights: each refit's fresh BF16 weights (generated on every core),
// what is sent of them (--prequantized: converted here; --fault: spoiled), the engine bytes they
// must give (the offline conversion in the spec's engine layout), their copy on the GPU (--gpu),
// and --dump.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#if REFIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_vmm_alloc.h"
#endif
#include "common/checksum.h"
#include "demo_model.h"
#include "example_trainer_internal.h"
#include "formats/safetensors.h"
#include "refit/checkpoint_io.h"
#include "refit/offline.h"
#include "spec/model_spec.h"

namespace refit::examples {

int DumpWeights(const TrainerFlags& flags, const spec::ModelSpec& spec) {
  // Writes the first refit's weights (model.safetensors, BF16 HF names) and their offline
  // conversion (converted.safetensors), for refitctl refit/verify; sends nothing.
  std::vector<std::vector<uint16_t>> weights;
  std::vector<ConvertedTensor> converted;
  std::vector<formats::SafetensorsWriteEntry> in, out;
  for (const demo::HfTensor& t : demo::Tensors(flags.shape)) {
    weights.push_back(demo::Weights(flags.seed * 1000003, t));
    const auto& w = weights.back();
    in.push_back({t.name, DType::kBF16, t.shape,
                  std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(w.data()), w.size() * 2), nullptr});
    absl::StatusOr<std::vector<ConvertedTensor>> conv = ConvertTensor(spec, t.name, DType::kBF16, t.shape, w.data());
    if (!conv.ok()) return Fail(conv.status().message());
    for (ConvertedTensor& c : *conv) converted.push_back(std::move(c));
  }
  for (const ConvertedTensor& c : converted) out.push_back({c.name, c.dtype, c.shape, c.bytes, nullptr});
  absl::Status st = formats::WriteSafetensors(flags.dump_dir + "/model.safetensors", in);
  if (st.ok()) st = formats::WriteSafetensors(flags.dump_dir + "/converted.safetensors", out);
  if (!st.ok()) return Fail(st.message());
  return 0;
}

absl::Status MakeRefitWeights(const TrainerFlags& flags, const spec::ModelSpec& spec, const std::string& model,
                              int refit, RefitWeights* out) {
  std::map<std::string, uint64_t>& expected = out->expected;
  std::vector<ConvertedTensor>& to_send = out->to_send;
  Manifest& manifest = out->manifest;
  uint64_t weights_seed = flags.seed * 1000003 + static_cast<uint64_t>(refit);
  manifest.model = model;
  if (!flags.tag.empty()) {
    manifest.tag = flags.refits == 1 && !flags.group ? flags.tag : absl::StrCat(flags.tag, "-", refit);
  }
  manifest.stage_only = flags.stage_only;
  // Generate the weights on every core (benchmark models are many GB).
  const std::vector<demo::HfTensor> tensors = demo::Tensors(flags.shape);
  // Without verification the workers also produce the bytes to send.
  const bool bytes_only = !flags.verify && !flags.prequantized;
  std::vector<std::vector<uint16_t>> generated(tensors.size());
  std::vector<std::vector<uint8_t>> generated_bytes(tensors.size());
  {
    std::atomic<size_t> next{0};
    std::vector<std::thread> workers;
    for (unsigned k = 0; k < std::max(1u, std::thread::hardware_concurrency()); ++k) {
      workers.emplace_back([&] {
        for (size_t i = next++; i < tensors.size(); i = next++) {
          generated[i] = demo::Weights(weights_seed, tensors[i]);
          if (!bytes_only) continue;
          generated_bytes[i].resize(generated[i].size() * 2);
          std::memcpy(generated_bytes[i].data(), generated[i].data(), generated_bytes[i].size());
          std::vector<uint16_t>().swap(generated[i]);
        }
      });
    }
    for (std::thread& w : workers) w.join();
  }
  // The engine's expected bytes: the offline conversion of every tensor (fused NVFP4 groups
  // sharing their amax) in the spec's engine layout (fused, stacked, sharded, laid out).
  if (!bytes_only) {
    std::vector<InputTensor> inputs;
    std::vector<storage::ParamInfo> infos;
    for (size_t ti = 0; ti < tensors.size(); ++ti) {
      const demo::HfTensor& t = tensors[ti];
      inputs.push_back({t.name, DType::kBF16, t.shape, generated[ti].data()});
      infos.push_back({t.name, DType::kBF16, t.shape, generated[ti].size() * 2});
    }
    absl::StatusOr<std::vector<ConvertedTensor>> all = ConvertCheckpoint(spec, inputs);
    absl::StatusOr<std::vector<ConvertedTensor>> layout =
        all.ok() ? EngineLayout(spec, infos, ByName(*all)) : absl::StatusOr<std::vector<ConvertedTensor>>(all.status());
    if (!layout.ok()) return layout.status();
    for (const ConvertedTensor& c : *layout) expected[c.name] = Checksum64(c.bytes.data(), c.bytes.size());
  }
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const demo::HfTensor& t = tensors[ti];
    if (bytes_only) {
      to_send.push_back({t.name, DType::kBF16, t.shape, std::move(generated_bytes[ti])});
      continue;
    }
    std::vector<uint16_t> w = std::move(generated[ti]);
    if (flags.prequantized) {
      absl::StatusOr<std::vector<ConvertedTensor>> conv = ConvertTensor(spec, t.name, DType::kBF16, t.shape, w.data());
      if (!conv.ok()) return conv.status();
      for (ConvertedTensor& c : *conv) to_send.push_back(std::move(c));
    } else {
      std::vector<uint8_t> bytes(w.size() * 2);
      std::memcpy(bytes.data(), w.data(), bytes.size());
      to_send.push_back({t.name, DType::kBF16, t.shape, std::move(bytes)});
    }
  }
  if (flags.fault == "drop-scale") {
    for (size_t i = 0; i < to_send.size(); ++i) {
      if (to_send[i].name.find("mlp.down_proj.weight_scale_inv") != std::string::npos) {
        to_send.erase(to_send.begin() + static_cast<long>(i));
        break;
      }
    }
  } else if (flags.fault == "strand-gate") {
    for (size_t i = 0; i < to_send.size(); ++i) {
      if (to_send[i].name.find("mlp.up_proj.weight") != std::string::npos) {
        to_send.erase(to_send.begin() + static_cast<long>(i));
        break;
      }
    }
  } else if (flags.fault == "duplicate") {
    to_send.push_back(to_send.front());
  } else if (flags.fault == "partial") {
    // A partial refit of one tensor (refused while the engine is dirty).
    to_send.resize(1);
    manifest.partial = true;
  }
  for (const ConvertedTensor& c : to_send) {
    manifest.tensors.push_back({c.name, c.dtype, c.shape, 0, c.bytes.size()});
  }
  if (flags.fault == "strand-gate" || flags.fault == "duplicate") {
    manifest.tensors.clear();  // let the commit-time check speak
  }
  if (flags.fault == "drop-scale") manifest.tensors.clear();
  return absl::OkStatus();
}

#if REFIT_HAVE_CUDA
absl::Status PlaceOnGpu(const TrainerFlags& flags, const std::vector<ConvertedTensor>& to_send, DeviceWeights* device,
                        std::vector<const void*>* sources) {
  // One allocation holding every tensor, kept across refits as a trainer keeps its
  // parameters (each refit's weights are written into it in place).
  uint64_t total = 0;
  for (const ConvertedTensor& c : to_send) total += (c.bytes.size() + 255) & ~uint64_t{255};
  if (total > device->bytes) {
    device->memory.reset();
    void* d = nullptr;
    std::string why;
    if (flags.vmm) {
      // Held until the process exits, as the examples' virtual memory is.
      if ((d = examples::AllocateVmm(flags.gpu, total, why, flags.vmm_piece_bytes)) == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", total, " bytes of virtual memory on GPU ", flags.gpu, ": ", why));
      }
      device->memory = std::shared_ptr<void>(d, [](void*) {});
    } else {
      if (cudaMalloc(&d, std::max<uint64_t>(total, 1)) != cudaSuccess) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", total, " bytes on GPU ", flags.gpu));
      }
      device->memory = std::shared_ptr<void>(d, [](void* p) { cudaFree(p); });
    }
    device->bytes = total;
  }
  void* d = device->memory.get();
  uint64_t offset = 0;
  for (size_t i = 0; i < to_send.size(); ++i) {
    uint8_t* at = static_cast<uint8_t*>(d) + offset;
    if (cudaMemcpy(at, to_send[i].bytes.data(), to_send[i].bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
      return absl::InternalError(absl::StrCat("cannot place '", to_send[i].name, "' on GPU ", flags.gpu));
    }
    (*sources)[i] = at;
    offset += (to_send[i].bytes.size() + 255) & ~uint64_t{255};
  }
  return absl::OkStatus();
}
#endif

}  // namespace refit::examples
