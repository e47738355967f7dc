// File descriptors over the control plane. CUDA virtual-memory allocations travel from an engine
// to refitd as POSIX file descriptors (cuMemExportToShareableHandle), attached to Cap'n Proto
// messages the way Cap'n Proto does it: a capability whose Server overrides getFd(), sent over a
// TwoPartyVatNetwork built on a kj::AsyncCapabilityStream (SCM_RIGHTS). Only Unix-socket
// connections pass descriptors; TCP and TLS connections pass none.
//
// Threading: a function of one stream, called on the thread of its event loop.
#ifndef REFIT_COMMON_FD_PASSING_H_
#define REFIT_COMMON_FD_PASSING_H_

#include <cstdint>

#include "kj/async-io.h"

namespace refit {

// The most descriptors one control message may carry (refitd reads no more: excess ones are
// closed on arrival), so an engine registers at most this many mapped pieces of virtual memory.
inline constexpr uint32_t kMaxFdsPerMessage = 64;

// `stream` as a capability stream when it is a Unix-domain socket (kj's TCP streams implement
// AsyncCapabilityStream too, but SCM_RIGHTS does not cross TCP, and TLS streams wrap another);
// null otherwise.
kj::Maybe<kj::AsyncCapabilityStream&> UnixCapabilityStream(kj::AsyncIoStream& stream);

}  // namespace refit

#endif  // REFIT_COMMON_FD_PASSING_H_
