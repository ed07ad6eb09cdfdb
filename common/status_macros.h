// Error propagation for functions that return absl::Status or absl::StatusOr<T>.
//
//   absl::Status Load(const std::string& path) {
//     RETURN_IF_ERROR(CheckReadable(path));
//     ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
//     ASSIGN_OR_RETURN(auto header, ParseHeader(bytes));
//     ...
//   }
//
// Both macros evaluate their expression exactly once. ASSIGN_OR_RETURN moves the value out of the
// StatusOr, so move-only types work. The first argument of ASSIGN_OR_RETURN must not contain an
// unparenthesized comma; wrap such a type in parentheses or use a type alias.
#ifndef TANDEM_COMMON_STATUS_MACROS_H_
#define TANDEM_COMMON_STATUS_MACROS_H_

#include "absl/strings/string_view.h"
#include <utility>  // std::move in ASSIGN_OR_RETURN

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// Returns `status` with `context` prepended to its message ("context: message"); the code and
// payloads are kept. An OK status is returned unchanged.
[[nodiscard]] absl::Status Annotate(const absl::Status& status, absl::string_view context);

namespace status_internal {
inline const absl::Status& AsStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}
}  // namespace status_internal

}  // namespace tandem

#define TANDEM_STATUS_CONCAT_INNER_(a, b) a##b
#define TANDEM_STATUS_CONCAT_(a, b) TANDEM_STATUS_CONCAT_INNER_(a, b)

// Returns the absl::Status of `expr` (an absl::Status or absl::StatusOr) from the current function
// when it is not OK.
#define RETURN_IF_ERROR(expr)                                                  \
  do {                                                                         \
    if (const auto& tandem_status_ = (expr); !tandem_status_.ok()) {           \
      return ::tandem::status_internal::AsStatus(tandem_status_);              \
    }                                                                          \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status when not OK, otherwise moves the
// value into `lhs`, which may be a declaration (`auto x`, `const Foo& y`) or an existing lvalue.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL_(TANDEM_STATUS_CONCAT_(tandem_statusor_, __COUNTER__), lhs, rexpr)

#define TANDEM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) {                                      \
    return std::move(statusor).status();                     \
  }                                                          \
  lhs = std::move(statusor).value()

#endif  // TANDEM_COMMON_STATUS_MACROS_H_
