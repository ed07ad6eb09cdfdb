// Status conversions at the process boundary: absl::Status <-> grpc::Status, and the HTTP status
// an API error maps to. absl and gRPC use the same numeric codes, so a status crosses the wire
// with its code and message unchanged.
#ifndef TANDEM_COMMON_STATUS_CONVERSION_H_
#define TANDEM_COMMON_STATUS_CONVERSION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace tandem {

// Keeps code and message, and the field of WithParam as gRPC's rich error model: error details
// (the "grpc-status-details-bin" trailer) holding a google.rpc.Status whose details are one
// google.rpc.BadRequest with a field violation {field: the param, description: the message}, as
// grpcio-status and other gRPC clients read it. Other absl payloads are not carried.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Keeps code and message, and the param of such details (malformed details are ignored); a code
// outside the known range becomes UNKNOWN, with the original number in the message.
absl::Status FromGrpcStatus(const grpc::Status& status);

// The HTTP status for an API error, as the OpenAI-compatible server returns it:
// INVALID_ARGUMENT/OUT_OF_RANGE/FAILED_PRECONDITION -> 400, UNAUTHENTICATED -> 401,
// PERMISSION_DENIED -> 403, NOT_FOUND -> 404, ALREADY_EXISTS/ABORTED -> 409,
// RESOURCE_EXHAUSTED -> 429, CANCELLED -> 499, UNIMPLEMENTED -> 501, UNAVAILABLE -> 503,
// DEADLINE_EXCEEDED -> 504, everything else -> 500; OK -> 200.
int HttpStatusFromCode(absl::StatusCode code);

// A hint that the client may try again after `delay` (a refusal under load): kept as an absl
// payload, sent as the HTTP Retry-After header and as the gRPC trailing metadata "retry-after"
// (kRetryAfterKey), both in whole seconds.
absl::Status WithRetryAfter(absl::Status status, absl::Duration delay);
std::optional<absl::Duration> RetryAfter(const absl::Status& status);
// `delay` in whole seconds, rounded up, at least 1 (the header's value).
int64_t RetryAfterSeconds(absl::Duration delay);
inline constexpr char kRetryAfterKey[] = "retry-after";

// The request field an error is about (OpenAI's error "param", e.g. "temperature" or
// "messages[1].content"): kept as an absl payload, sent as the HTTP error body's "param". The
// message should name the field too: gRPC clients see only the message.
absl::Status WithParam(absl::Status status, absl::string_view param);
// The field set by WithParam, or nullopt.
std::optional<std::string> ParamOf(const absl::Status& status);

}  // namespace tandem

#endif  // TANDEM_COMMON_STATUS_CONVERSION_H_
