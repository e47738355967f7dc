// Sender process for the peer-death tests:
//   transport_test_sender <config> <endpoint> <tag> <bytes> <count> [report]
// connects with the named transport configuration and sends `count` messages (0 = until killed)
// of `bytes` bytes on `tag`; message i carries Pattern(seed = i). With `report` it writes
// "sent <i>" to stdout after each message, so a test knows where in the stream it stopped it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "transport_test_support.h"

int main(int argc, char** argv) {
  using namespace refit::transport::testing;
  if (argc != 6 && !(argc == 7 && std::string(argv[6]) == "report")) {
    std::fprintf(stderr, "usage: %s <config> <endpoint> <tag> <bytes> <count> [report]\n", argv[0]);
    return 2;
  }
  const bool report = argc == 7;
  std::optional<TransportConfig> config = FindTransportConfig(argv[1]);
  if (!config) {
    std::fprintf(stderr, "unknown transport configuration %s\n", argv[1]);
    return 2;
  }
  const uint64_t tag = std::strtoull(argv[3], nullptr, 10);
  const uint64_t bytes = std::strtoull(argv[4], nullptr, 10);
  const uint64_t count = std::strtoull(argv[5], nullptr, 10);
  auto sender = config->connect(argv[2]);
  if (!sender.ok()) {
    std::fprintf(stderr, "connect: %s\n", sender.status().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> buffer(bytes);
  for (uint64_t i = 0; count == 0 || i < count; ++i) {
    FillPattern(i, buffer.data(), bytes);
    if (absl::Status st = (*sender)->Send(tag, buffer.data(), bytes); !st.ok()) {
      std::fprintf(stderr, "send %llu: %s\n", static_cast<unsigned long long>(i),
                   st.ToString().c_str());
      return 1;
    }
    if (report) {
      std::printf("sent %llu\n", static_cast<unsigned long long>(i));
      std::fflush(stdout);
    }
  }
  return 0;
}
