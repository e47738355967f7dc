// Catches UCX's own reports of resources that were still in use when a UCP worker or context was
// destroyed: a registration-cache region still referenced ("destroying inuse"), a request or
// rkey never returned to its pool ("was not returned to mpool"), an endpoint never closed. A UCX
// built with assertions (Debian's package, debug builds) aborts on some of these in ucp_cleanup;
// release builds (the PyPI wheels) only warn, at warning level, which the tests otherwise keep
// quiet. The watch lets a test fail on them under every UCX it runs against.
//
// Threading: UCX may log from any of its threads; everything here is safe to call from any thread.
#ifndef REFIT_TESTS_UNIT_TRANSPORT_UCX_LEAK_WATCH_H_
#define REFIT_TESTS_UNIT_TRANSPORT_UCX_LEAK_WATCH_H_

#include <string>
#include <vector>

namespace refit::transport::testing {

// Installs the process-wide UCX log handler (once) and sets UCX's log level to "warn" so that the
// reports reach it. Other warnings are dropped, as SetUcxLogLevel("error") would drop them;
// errors are printed as usual.
void WatchUcxLeaks();

// The leak reports logged since the last call, and forgets them.
std::vector<std::string> TakeUcxLeakReports();

}  // namespace refit::transport::testing

#endif  // REFIT_TESTS_UNIT_TRANSPORT_UCX_LEAK_WATCH_H_
