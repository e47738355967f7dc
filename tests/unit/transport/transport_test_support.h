// Support for the transport conformance suite: the transport configurations under test (every
// transport of BuiltinTransports() as its descriptor makes it, plus further UCX configurations),
// each a small factory for a Receiver and a Sender, and a payload pattern that sender and
// receiver compute independently.
//
// Threading: the factories may be called from any thread.
#ifndef REFIT_TESTS_UNIT_TRANSPORT_TRANSPORT_TEST_SUPPORT_H_
#define REFIT_TESTS_UNIT_TRANSPORT_TRANSPORT_TEST_SUPPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace refit::transport::testing {

struct TransportConfig {
  std::string name;  // also the name transport_test_sender takes on its command line
  std::function<absl::StatusOr<std::unique_ptr<Receiver>>()> listen;
  std::function<absl::StatusOr<std::unique_ptr<Sender>>(const std::string& endpoint)> connect;
  // Non-empty when this machine cannot run the configuration (e.g. "needs 2 CUDA devices, 0
  // present"); the suite then skips it, printing the reason.
  std::function<std::string()> unavailable;
  // What the receiver's ChecksIntegrity() must say (the descriptor's checks_integrity).
  bool checks_integrity = false;
};

// gtest prints a configuration by its name.
inline void PrintTo(const TransportConfig& config, std::ostream* os) { *os << config.name; }

std::vector<TransportConfig> AllTransportConfigs();

// Keeps transport libraries to errors only (e.g. UCX warns about messages still queued when a
// receiver that saw a peer die is destroyed), except UCX's leak reports (ucx_leak_watch.h).
void QuietTransportLogs();
// nullopt when no configuration has that name.
std::optional<TransportConfig> FindTransportConfig(std::string_view name);

// The transport_test_sender program, for tests that run a sender in a process of its own:
// $REFIT_TRANSPORT_TEST_SENDER if set, else the build puts it beside the test binaries of this
// folder, so it is looked up next to the running binary (/proc/self/exe) and one folder up. No
// build path is compiled in: the binaries may run from another tree than they were built in (a
// build copied to a GPU machine). Empty when not found.
std::string TestSenderPath();

// Deterministic bytes derived from (seed, offset); different seeds give different contents.
void FillPattern(uint64_t seed, uint8_t* dst, uint64_t bytes);
std::vector<uint8_t> Pattern(uint64_t seed, uint64_t bytes);
// Offset of the first byte that differs from the pattern, or -1 when all match.
int64_t FirstPatternMismatch(uint64_t seed, const uint8_t* data, uint64_t bytes);

}  // namespace refit::transport::testing

#endif  // REFIT_TESTS_UNIT_TRANSPORT_TRANSPORT_TEST_SUPPORT_H_
