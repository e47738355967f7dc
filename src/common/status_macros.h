// Early-return helpers for absl::Status / absl::StatusOr.
#ifndef REFIT_COMMON_STATUS_MACROS_H_
#define REFIT_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define REFIT_CONCAT_INNER_(a, b) a##b
#define REFIT_CONCAT_(a, b) REFIT_CONCAT_INNER_(a, b)

#define REFIT_RETURN_IF_ERROR(expr)            \
  do {                                         \
    ::absl::Status refit_status_ = (expr);     \
    if (!refit_status_.ok()) return refit_status_; \
  } while (0)

#define REFIT_ASSIGN_OR_RETURN(lhs, expr) \
  REFIT_ASSIGN_OR_RETURN_IMPL_(REFIT_CONCAT_(refit_statusor_, __LINE__), lhs, expr)
#define REFIT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#endif  // REFIT_COMMON_STATUS_MACROS_H_
