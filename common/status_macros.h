#pragma once

// Local versions of the status macros that later Abseil releases ship, with
// the same names and shapes, so a later Abseil is a rename.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SB_STATUS_CONCAT_INNER_(a, b) a##b
#define SB_STATUS_CONCAT_(a, b) SB_STATUS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::absl::Status sb_status_ = (expr);      \
    if (!sb_status_.ok()) return sb_status_; \
  } while (0)

// ASSIGN_OR_RETURN(auto x, Fn()); returns Fn()'s status if it is not OK.
#define ASSIGN_OR_RETURN(lhs, expr) \
  SB_ASSIGN_OR_RETURN_IMPL_(SB_STATUS_CONCAT_(sb_statusor_, __LINE__), lhs, expr)

#define SB_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                              \
  if (!statusor.ok()) return statusor.status();        \
  lhs = std::move(statusor).value()
