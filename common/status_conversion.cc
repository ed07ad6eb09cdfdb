#include "common/status_conversion.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {

namespace {

// gRPC's rich error model by hand (the protobuf wire format of google.rpc.Status, whose details
// hold one google.protobuf.Any of a google.rpc.BadRequest with one field violation): the googleapis
// protos are not a dependency, and these are four small messages.
constexpr absl::string_view kBadRequestType = "type.googleapis.com/google.rpc.BadRequest";

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void PutBytes(std::string& out, int field, absl::string_view bytes) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | 2);
  PutVarint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

std::string EncodeDetails(const absl::Status& status, absl::string_view param) {
  std::string violation, bad_request, any, out;
  PutBytes(violation, 1, param);             // FieldViolation.field
  PutBytes(violation, 2, status.message());  // FieldViolation.description
  PutBytes(bad_request, 1, violation);       // BadRequest.field_violations
  PutBytes(any, 1, kBadRequestType);         // Any.type_url
  PutBytes(any, 2, bad_request);             // Any.value
  PutVarint(out, (1 << 3) | 0);              // Status.code
  PutVarint(out, static_cast<uint64_t>(status.code()));
  PutBytes(out, 2, status.message());        // Status.message
  PutBytes(out, 3, any);                     // Status.details
  return out;
}

// Reads a message's fields: `on_bytes(field, bytes)` for each length-delimited one; varint and
// fixed-width fields are skipped. False for bytes that are not a message (bounds checked: the
// details come from a peer).
template <typename OnBytes>
bool ForEachField(absl::string_view in, OnBytes on_bytes) {
  size_t i = 0;
  auto varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i >= in.size()) return false;
      const auto byte = static_cast<uint8_t>(in[i++]);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  };
  while (i < in.size()) {
    uint64_t key = 0, v = 0;
    if (!varint(key)) return false;
    switch (key & 7) {
      case 0:
        if (!varint(v)) return false;
        break;
      case 1:
        if (in.size() - i < 8) return false;
        i += 8;
        break;
      case 5:
        if (in.size() - i < 4) return false;
        i += 4;
        break;
      case 2:
        if (!varint(v) || v > in.size() - i) return false;
        on_bytes(key >> 3, in.substr(i, v));
        i += v;
        break;
      default:
        return false;
    }
  }
  return true;
}

// The first field violation's field of a google.rpc.Status's BadRequest detail, if any.
std::optional<std::string> DecodeParam(absl::string_view details) {
  std::optional<std::string> param;
  ForEachField(details, [&](uint64_t field, absl::string_view any) {
    if (field != 3 || param.has_value()) return;
    absl::string_view type, value;
    if (!ForEachField(any, [&](uint64_t f, absl::string_view b) {
          if (f == 1) type = b;
          if (f == 2) value = b;
        }) ||
        type != kBadRequestType) {
      return;
    }
    ForEachField(value, [&](uint64_t f, absl::string_view violation) {
      if (f != 1 || param.has_value()) return;
      ForEachField(violation, [&](uint64_t g, absl::string_view b) {
        if (g == 1 && !param.has_value() && !b.empty()) param = std::string(b);
      });
    });
  });
  return param;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.code());
  if (std::optional<std::string> param = ParamOf(status); param.has_value()) {
    return grpc::Status(code, std::string(status.message()), EncodeDetails(status, *param));
  }
  return grpc::Status(code, std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  if (code < 1 || code > 16) {
    return absl::UnknownError(
        absl::StrCat("gRPC status code ", code, ": ", status.error_message()));
  }
  absl::Status out(static_cast<absl::StatusCode>(code), status.error_message());
  if (std::optional<std::string> param = DecodeParam(status.error_details()); param.has_value()) {
    out = WithParam(std::move(out), *param);
  }
  return out;
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
