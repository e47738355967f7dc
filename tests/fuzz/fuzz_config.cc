// Fuzz target: refitd's daemon configuration loader (server::ParseConfig).
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/config.h"
#include "transport/builtin_transports.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const refit::transport::TransportRegistry transports = refit::transport::BuiltinTransports();
  std::string yaml(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<refit::server::Config> c = refit::server::ParseConfig(yaml, "<fuzz>", transports);
  (void)c;
  return 0;
}
