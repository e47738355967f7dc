// Helpers of the CUDA IPC data plane: its Unix control socket (listen, connect, whole-record
// reads and writes, liveness), endpoint strings, the per-process token, the query that finds the
// CUDA allocation holding a pointer (base, size, unique buffer id; the DeviceEnv's,
// common/device_env.h) and the export of CUDA virtual memory as descriptors.
//
// Threading: free functions, thread-safe.
#ifndef REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_HANDLES_H_
#define REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_HANDLES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/device_env.h"
#include "common/unique_fd.h"

namespace refit::transport::cuda_ipc {

// CUDA errors as this transport reports them: the project's CudaStatus, as Unavailable.
absl::Status CudaStatus(int cuda_error, absl::string_view what);

// This process's random token (cuda_ipc_wire.h), the same on every call.
uint64_t ProcessToken();

// "cuda_ipc:<socket>" <-> the socket name ('@' first: the abstract namespace).
std::string FormatEndpoint(const std::string& socket);
absl::StatusOr<std::string> ParseEndpoint(const std::string& endpoint);

// A listening Unix stream socket. `path` empty: a fresh abstract name, returned in `bound`.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, std::string& bound);
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& socket);

// All return Unavailable on a broken or closed connection.
absl::Status WriteAll(int fd, const void* data, uint64_t bytes);
// Reads exactly `bytes`. DeadlineExceeded past `deadline`; Cancelled when `stop` (polled every
// 100 ms, may be empty) turns true before the first byte.
absl::Status ReadAll(int fd, void* data, uint64_t bytes, absl::Time deadline,
                     const std::function<bool()>& stop = nullptr);
// OK while the connection is open (the peer has not closed or reset it).
absl::Status CheckOpen(int fd, absl::string_view peer);

// The CUDA allocation holding a pointer: DefaultDeviceEnv().QueryAllocation. Plain host memory
// gives device = false. Unavailable when the driver has no such query.
using Allocation = ::refit::AllocationInfo;
absl::StatusOr<Allocation> QueryAllocation(const void* p);

// CUDA virtual memory (cuMemCreate + cuMemMap: PyTorch's expandable segments, vLLM's and SGLang's
// sleep-mode allocators): the mapped pieces holding [p, p + bytes), at consecutive addresses, each
// exported as a POSIX descriptor (cuMemExportToShareableHandle). Empty when the bytes are not all
// in such pieces, or a piece was allocated without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, or
// more than kMaxVmmPieces would be needed (the caller then copies the bytes instead).
struct VmmPiece {
  uint64_t base = 0;
  uint64_t size = 0;
  uint64_t buffer_id = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID of the mapping (to notice it is gone)
  UniqueFd fd;
};
std::vector<VmmPiece> ExportVmmPieces(const void* p, uint64_t bytes);

// `bytes` of `data` and the descriptors `fds` in one sendmsg (SCM_RIGHTS), and its counterpart,
// which reads exactly `bytes` and returns the descriptors that came with them.
absl::Status SendWithFds(int sock, const void* data, uint64_t bytes, const std::vector<int>& fds);
absl::Status RecvWithFds(int sock, void* data, uint64_t bytes, std::vector<UniqueFd>& fds, absl::Time deadline);

}  // namespace refit::transport::cuda_ipc

#endif  // REFIT_TRANSPORT_CUDA_IPC_CUDA_IPC_HANDLES_H_
