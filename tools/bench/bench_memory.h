// The kinds of memory the benchmarks compare refitd's copies and kernels on, besides their own
// cudaMalloc: memory of another process opened by its CUDA IPC handle (as refitd reads a
// colocated trainer's cudaMalloc and writes an IPC engine's), and CUDA virtual memory imported
// from its POSIX descriptor (as refitd maps a virtual-memory engine's or trainer's).
#ifndef REFIT_TOOLS_BENCH_BENCH_MEMORY_H_
#define REFIT_TOOLS_BENCH_BENCH_MEMORY_H_

#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "common/cuda_vmm.h"
#include "storage/vmm_import.h"

namespace refit::bench {

// CUDA virtual memory made here with the POSIX descriptor handle type, exported and imported back
// from its descriptor (storage::VmmImport). Null when the device has no such memory.
inline std::unique_ptr<storage::VmmImport> ImportedVmm(uint64_t bytes, int device = 0) {
  const CudaVmmDriver& d = VmmDriver();
  const CUmemAllocationProp prop = DeviceVmmProp(device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  size_t g = 0;
  if (!d.can_allocate() || d.export_handle == nullptr ||
      d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS) {
    return nullptr;
  }
  const uint64_t size = (bytes + g - 1) / g * g;
  CUmemGenericAllocationHandle handle = 0;
  if (d.create(&handle, size, &prop, 0) != CUDA_SUCCESS) return nullptr;
  std::unique_ptr<storage::VmmImport> out;
  int fd = -1;
  if (d.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS) {
    auto imported = storage::VmmImport::Import({{fd, size}}, device);
    if (imported.ok()) out = std::move(*imported);
    close(fd);
  }
  d.release(handle);  // the import holds its own reference
  return out;
}

// The child's side of ChildAllocation, which a program's main calls first: for `--ipc-child
// BYTES` (*is_child set) it allocates BYTES on the device, writes its CUDA IPC handle to stdout,
// holds the memory until stdin closes and returns the exit status.
inline int IpcChildMain(int argc, char** argv, bool* is_child) {
  *is_child = argc == 3 && std::strcmp(argv[1], "--ipc-child") == 0;
  if (!*is_child) return 0;
  void* p = nullptr;
  cudaIpcMemHandle_t h;
  if (cudaMalloc(&p, std::strtoull(argv[2], nullptr, 10)) != cudaSuccess || cudaIpcGetMemHandle(&h, p) != cudaSuccess) {
    return 1;
  }
  if (std::fwrite(&h, sizeof(h), 1, stdout) != 1) return 1;
  std::fflush(stdout);
  char c;
  while (std::fread(&c, 1, 1, stdin) == 1) {
  }
  cudaFree(p);
  return 0;
}

// `bytes` of another process's cudaMalloc (this program run again as `argv0 --ipc-child BYTES`),
// opened here by its CUDA IPC handle. Null when it could not be opened.
class ChildAllocation {
 public:
  static std::unique_ptr<ChildAllocation> Open(const char* argv0, uint64_t bytes) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0) return nullptr;
    if (pipe(from_child) != 0) {
      close(to_child[0]);
      close(to_child[1]);
      return nullptr;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      close(to_child[1]);
      close(from_child[0]);
      execl(argv0, argv0, "--ipc-child", std::to_string(bytes).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    std::unique_ptr<ChildAllocation> a(new ChildAllocation(pid, to_child[1], from_child[0]));
    cudaIpcMemHandle_t handle;
    if (pid < 0 || read(a->from_child_, &handle, sizeof(handle)) != sizeof(handle) ||
        cudaIpcOpenMemHandle(&a->data_, handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
      a->data_ = nullptr;
      return nullptr;
    }
    return a;
  }
  ~ChildAllocation() {
    if (data_ != nullptr) cudaIpcCloseMemHandle(data_);
    close(to_child_);  // the child frees its memory and exits
    close(from_child_);
    int status = 0;
    if (pid_ > 0) waitpid(pid_, &status, 0);
  }
  ChildAllocation(const ChildAllocation&) = delete;
  ChildAllocation& operator=(const ChildAllocation&) = delete;

  uint8_t* data() const { return static_cast<uint8_t*>(data_); }

 private:
  ChildAllocation(pid_t pid, int to_child, int from_child) : pid_(pid), to_child_(to_child), from_child_(from_child) {}
  pid_t pid_;
  int to_child_, from_child_;
  void* data_ = nullptr;
};

}  // namespace refit::bench

#endif  // REFIT_TOOLS_BENCH_BENCH_MEMORY_H_

