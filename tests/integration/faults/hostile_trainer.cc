// A trainer that sends hostile tensor names (tests/integration/faults/test_hostile_inputs.py).
//
//   hostile_trainer --address A --manifest-name HEX   begins a session whose manifest lists one
//                                                     tensor of that name
//   hostile_trainer --address A --push-name HEX       begins a valid session (one demo tensor),
//                   [--push-rank R]                   pushes a tensor of that name (of shape
//                                                     [1] * R with --push-rank), commits
//
// Names are hex so that NUL and newlines pass the command line. Prints one JSON line: the stage
// that failed and the error text as hex (so the test sees every byte refitd sent back).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/trainer_client.h"
#include "demo_model.h"

namespace {

int Report(const std::string& stage, const absl::Status& s) {
  const std::string text(s.message());
  std::printf("{\"stage\":\"%s\",\"ok\":%s,\"error_hex\":\"%s\"}\n", stage.c_str(), s.ok() ? "true" : "false",
              absl::BytesToHexString(text).c_str());
  return s.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace refit;
  std::string address, manifest_name, push_name;
  int push_rank = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--address") address = argv[i + 1];
    if (a == "--manifest-name") manifest_name = absl::HexStringToBytes(argv[i + 1]);
    if (a == "--push-name") push_name = absl::HexStringToBytes(argv[i + 1]);
    if (a == "--push-rank") push_rank = std::atoi(argv[i + 1]);
  }
  absl::StatusOr<std::unique_ptr<client::TrainerClient>> c = client::TrainerClient::Connect(address);
  if (!c.ok()) return Report("connect", c.status());
  absl::StatusOr<client::DaemonStatus> status = (*c)->Status();
  if (!status.ok()) return Report("status", status.status());
  const demo::HfTensor first = demo::Tensors(demo::ModelShape{}).front();
  Manifest m;
  m.model = status->model;
  TensorDesc t;
  t.dtype = DType::kBF16;
  t.shape = first.shape;
  t.nbytes = *DenseBytes(t.dtype, t.shape);
  t.name = manifest_name.empty() ? first.name : manifest_name;
  m.tensors.push_back(t);
  absl::StatusOr<std::unique_ptr<client::RefitSession>> s = (*c)->Begin(m);
  if (!s.ok()) return Report("begin", s.status());
  if (!push_name.empty()) {
    std::vector<uint16_t> weights(t.nbytes / 2, 0x3F80);
    const Shape shape = push_rank > 0 ? Shape(static_cast<size_t>(push_rank), 1) : t.shape;
    absl::Status pushed = (*s)->Push(client::TensorRef{push_name, t.dtype, shape, weights.data()});
    if (!pushed.ok()) return Report("push", pushed);
    absl::StatusOr<RefitReport> r = (*s)->Commit();
    if (!r.ok()) return Report("commit", r.status());
  }
  return Report("done", absl::OkStatus());
}
