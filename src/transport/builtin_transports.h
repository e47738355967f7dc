// The one place that lists the transports compiled into a binary. refitd (main.cc), the trainer
// client and the transport conformance suite all take their TransportRegistry from here.
// Adding a transport: its folder src/transport/<name>/ plus one line in builtin_transports.cc
// (docs/extending.md).
#ifndef REFIT_TRANSPORT_BUILTIN_TRANSPORTS_H_
#define REFIT_TRANSPORT_BUILTIN_TRANSPORTS_H_

#include "transport/registry.h"

namespace refit::transport {

// A fresh registry of every built-in transport; the first is the default.
TransportRegistry BuiltinTransports();

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_BUILTIN_TRANSPORTS_H_
