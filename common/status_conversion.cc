#include "common/status_conversion.h"

#include <algorithm>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  if (code < 1 || code > 16) {
    return absl::UnknownError(
        absl::StrCat("gRPC status code ", code, ": ", status.error_message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

int HttpStatusFromCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

namespace {
constexpr char kRetryAfterPayload[] = "type.tandem.dev/RetryAfterMicros";
constexpr char kParamPayload[] = "type.tandem.dev/Param";
}  // namespace

absl::Status WithRetryAfter(absl::Status status, absl::Duration delay) {
  if (!status.ok()) {
    status.SetPayload(kRetryAfterPayload, absl::Cord(absl::StrCat(absl::ToInt64Microseconds(
                                              std::max(delay, absl::ZeroDuration())))));
  }
  return status;
}

std::optional<absl::Duration> RetryAfter(const absl::Status& status) {
  const auto payload = status.GetPayload(kRetryAfterPayload);  // absl::optional here
  int64_t micros = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &micros)) {
    return std::nullopt;
  }
  return absl::Microseconds(micros);
}

int64_t RetryAfterSeconds(absl::Duration delay) {
  return std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(delay, absl::Seconds(1))));
}

absl::Status WithParam(absl::Status status, absl::string_view param) {
  if (!status.ok()) status.SetPayload(kParamPayload, absl::Cord(std::string(param)));
  return status;
}

std::optional<std::string> ParamOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kParamPayload);
  if (!payload.has_value()) return std::nullopt;
  return std::string(*payload);
}

}  // namespace tandem
