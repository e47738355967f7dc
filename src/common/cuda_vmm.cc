#include "common/cuda_vmm.h"

#include <cuda_runtime_api.h>

namespace refit {
namespace {

// The CUDA driver's entry point `name` at API `version` (cuGetProcAddress numbering, e.g. 10020),
// looked up through the runtime, cast to `Fn` and stored in `*out` when found.
template <typename Fn>
void LoadDriverEntryPoint(const char* name, int version, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  const bool ok = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found) == cudaSuccess &&
                  found == cudaDriverEntryPointSuccess;
  (void)cudaGetLastError();
  if (ok) *out = reinterpret_cast<Fn>(fn);
}

}  // namespace

const CudaVmmDriver& VmmDriver() {
  static const CudaVmmDriver d = [] {
    CudaVmmDriver d;
    LoadDriverEntryPoint("cuMemCreate", 10020, &d.create);
    LoadDriverEntryPoint("cuMemRelease", 10020, &d.release);
    LoadDriverEntryPoint("cuMemAddressReserve", 10020, &d.reserve);
    LoadDriverEntryPoint("cuMemAddressFree", 10020, &d.address_free);
    LoadDriverEntryPoint("cuMemMap", 10020, &d.map);
    LoadDriverEntryPoint("cuMemUnmap", 10020, &d.unmap);
    LoadDriverEntryPoint("cuMemSetAccess", 10020, &d.set_access);
    LoadDriverEntryPoint("cuMemGetAllocationGranularity", 10020, &d.granularity);
    LoadDriverEntryPoint("cuMemExportToShareableHandle", 10020, &d.export_handle);
    LoadDriverEntryPoint("cuMemImportFromShareableHandle", 10020, &d.import);
    LoadDriverEntryPoint("cuMemRetainAllocationHandle", 11000, &d.retain);
    LoadDriverEntryPoint("cuMemGetAllocationPropertiesFromHandle", 10020, &d.properties);
    LoadDriverEntryPoint("cuMemGetAddressRange", 3020, &d.address_range);
    LoadDriverEntryPoint("cuGetErrorString", 6000, &d.error_string);
    LoadDriverEntryPoint("cuPointerGetAttributes", 7000, &d.pointer_attributes);
    return d;
  }();
  return d;
}

}  // namespace refit
