// The demo model shared by the example engine, the example trainer and tests: a small
// Llama-shaped model (HF names), deterministic pseudo-random BF16 weights per refit.
#ifndef REFIT_TOOLS_EXAMPLES_DEMO_MODEL_H_
#define REFIT_TOOLS_EXAMPLES_DEMO_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace refit::demo {

struct ModelShape {
  int layers = 2;
  int hidden = 256;
  int intermediate = 640;  // not a multiple of 128: exercises partial FP8 tiles
  int kv_hidden = 128;
  int vocab = 1000;
  // MoE (Qwen3-MoE names) when experts > 0: per layer a router (mlp.gate.weight) and `experts`
  // experts of moe_intermediate instead of the dense MLP.
  int experts = 0;
  int moe_intermediate = 128;
};

struct HfTensor {
  std::string name;
  Shape shape;
};

std::vector<HfTensor> Tensors(const ModelShape& shape);
// Deterministic pseudo-random BF16 values (sd ~0.02) for (seed, tensor name); norms are ~1.
std::vector<uint16_t> Weights(uint64_t seed, const HfTensor& t);
// Parses "--layers N --hidden N --intermediate N --kv-hidden N --vocab N --experts N
// --moe-intermediate N" flags; returns false
// for an unknown flag at argv[i].
bool ParseShapeFlag(int argc, char** argv, int& i, ModelShape& shape);

}  // namespace refit::demo

#endif  // REFIT_TOOLS_EXAMPLES_DEMO_MODEL_H_
