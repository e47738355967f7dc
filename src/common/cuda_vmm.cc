#include "common/cuda_vmm.h"

#include "common/cuda_status.h"

namespace refit {

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
    return d;
  }();
  return d;
}

}  // namespace refit
