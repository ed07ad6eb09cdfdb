// Status conversions at the process boundary: absl::Status <-> grpc::Status, and the HTTP status
// an API error maps to. absl and gRPC use the same numeric codes, so a status crosses the wire
// with its code and message unchanged.
#ifndef TANDEM_COMMON_STATUS_CONVERSION_H_
#define TANDEM_COMMON_STATUS_CONVERSION_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tandem {

// Keeps code and message. absl payloads are not carried.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Keeps code and message; a code outside the known range becomes UNKNOWN, with the original
// number in the message.
absl::Status FromGrpcStatus(const grpc::Status& status);

// The HTTP status for an API error, as the OpenAI-compatible server returns it:
// INVALID_ARGUMENT/OUT_OF_RANGE/FAILED_PRECONDITION -> 400, UNAUTHENTICATED -> 401,
// PERMISSION_DENIED -> 403, NOT_FOUND -> 404, ALREADY_EXISTS/ABORTED -> 409,
// RESOURCE_EXHAUSTED -> 429, CANCELLED -> 499, UNIMPLEMENTED -> 501, UNAVAILABLE -> 503,
// DEADLINE_EXCEEDED -> 504, everything else -> 500; OK -> 200.
int HttpStatusFromCode(absl::StatusCode code);

}  // namespace tandem

#endif  // TANDEM_COMMON_STATUS_CONVERSION_H_
