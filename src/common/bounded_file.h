// Reading a whole file that an operator names (config, model spec, quant_config, TLS PEM, token)
// with a size cap, so a wrong path (/dev/zero, a FIFO, a multi-GB file) is refused with an error
// naming the file instead of exhausting memory or blocking start-up.
//
// Thread-safe (no shared state).
#ifndef REFIT_COMMON_BOUNDED_FILE_H_
#define REFIT_COMMON_BOUNDED_FILE_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace refit {

// The contents of the regular file at `path`, at most `max_bytes` of it. Refused: a path that
// is not a regular file (device, FIFO, socket, directory), a file larger than `max_bytes`
// (checked before reading, and again while reading, by reading at most max_bytes + 1 bytes).
// Error texts name the file as "<what> '<path>'" ("cannot read config '/etc/x': No such file or
// directory", "config '/dev/zero' is not a regular file (a character device)"); a missing file is
// NotFound, a file too large or not regular InvalidArgument, a read error Unavailable.
absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, uint64_t max_bytes, absl::string_view what);

}  // namespace refit

#endif  // REFIT_COMMON_BOUNDED_FILE_H_
