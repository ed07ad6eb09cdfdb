#include "common/trace_context.h"

#include <map>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace tandem {
namespace {

// version 00: "vv-" + 32 + "-" + 16 + "-" + 2.
constexpr size_t kTraceparentLength = 55;

bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// Whether `field` is lowercase hex only, and if so whether it is all zeros.
absl::Status CheckHexField(absl::string_view field, absl::string_view name, bool zero_allowed) {
  bool zero = true;
  for (char c : field) {
    if (!IsLowerHex(c)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the traceparent's ", name, " '", field, "' is not lowercase hex"));
    }
    zero = zero && c == '0';
  }
  if (zero && !zero_allowed) {
    return absl::InvalidArgumentError(
        absl::StrCat("the traceparent's ", name, " is all zeros"));
  }
  return absl::OkStatus();
}

int HexValue(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

std::string RandomHex(absl::BitGenRef bits, int words) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  while (true) {
    out.clear();
    bool zero = true;
    for (int w = 0; w < words; ++w) {
      const uint64_t v = absl::Uniform<uint64_t>(bits);
      zero = zero && v == 0;
      for (int shift = 60; shift >= 0; shift -= 4) out.push_back(kDigits[(v >> shift) & 0xf]);
    }
    if (!zero) return out;  // all zeros is invalid (a chance of 2^-64 or less)
  }
}

absl::BitGen& ThreadBits() {
  thread_local absl::BitGen bits;
  return bits;
}

// A received value, quoted for a message, cut after 64 characters.
std::string Quoted(absl::string_view v) {
  return v.size() <= 64 ? absl::StrCat("'", v, "'") : absl::StrCat("'", v.substr(0, 64), "...'");
}

absl::string_view TrimOws(absl::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool UsableTracestate(absl::string_view s) {
  if (s.size() > kMaxTracestateBytes) return false;
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<TraceContext> TraceContext::Parse(absl::string_view traceparent,
                                                 absl::string_view tracestate) {
  const absl::string_view v = TrimOws(traceparent);
  if (v.size() < kTraceparentLength) {
    return absl::InvalidArgumentError(absl::StrCat("the traceparent ", Quoted(v), " has ",
                                                   v.size(), " characters; it needs ",
                                                   kTraceparentLength));
  }
  if (v[2] != '-' || v[35] != '-' || v[52] != '-') {
    return absl::InvalidArgumentError(absl::StrCat(
        "the traceparent ", Quoted(v), " is not version-traceid-parentid-flags separated by '-'"));
  }
  const absl::string_view version = v.substr(0, 2);
  RETURN_IF_ERROR(CheckHexField(version, "version", /*zero_allowed=*/true));
  if (version == "ff") return absl::InvalidArgumentError("the traceparent's version ff is invalid");
  if (version == "00" && v.size() != kTraceparentLength) {
    return absl::InvalidArgumentError(absl::StrCat("the version 00 traceparent ", Quoted(v),
                                                   " has ", v.size(),
                                                   " characters; it needs exactly ",
                                                   kTraceparentLength));
  }
  // A later version may add fields after the four of version 00, each after a '-'.
  if (v.size() > kTraceparentLength && v[kTraceparentLength] != '-') {
    return absl::InvalidArgumentError(
        absl::StrCat("the traceparent ", Quoted(v), " has no '-' after its flags"));
  }
  TraceContext t;
  t.trace_id_ = std::string(v.substr(3, 32));
  t.span_id_ = std::string(v.substr(36, 16));
  const absl::string_view flags = v.substr(53, 2);
  RETURN_IF_ERROR(CheckHexField(t.trace_id_, "trace id", /*zero_allowed=*/false));
  RETURN_IF_ERROR(CheckHexField(t.span_id_, "parent id", /*zero_allowed=*/false));
  RETURN_IF_ERROR(CheckHexField(flags, "flags", /*zero_allowed=*/true));
  t.flags_ = static_cast<uint8_t>(HexValue(flags[0]) * 16 + HexValue(flags[1]));
  const absl::string_view state = TrimOws(tracestate);
  if (UsableTracestate(state)) t.tracestate_ = std::string(state);
  return t;
}

TraceContext TraceContext::NewTrace(absl::BitGenRef bits) {
  TraceContext t;
  t.trace_id_ = RandomHex(bits, 2);
  t.span_id_ = RandomHex(bits, 1);
  t.flags_ = 0x01;
  return t;
}

TraceContext TraceContext::NewTrace() { return NewTrace(ThreadBits()); }

TraceContext TraceContext::Child(absl::BitGenRef bits) const {
  TraceContext t = *this;
  t.parent_id_ = span_id_;
  t.span_id_ = RandomHex(bits, 1);
  return t;
}

TraceContext TraceContext::Child() const { return Child(ThreadBits()); }

std::string TraceContext::traceparent() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  const char flags[2] = {kDigits[flags_ >> 4], kDigits[flags_ & 0xf]};
  return absl::StrCat("00-", trace_id_, "-", span_id_, "-", absl::string_view(flags, 2));
}

TraceContext SpanForRequest(absl::Span<const absl::string_view> traceparents,
                            absl::Span<const absl::string_view> tracestates,
                            absl::Status* rejected) {
  if (rejected != nullptr) *rejected = absl::OkStatus();
  if (traceparents.empty()) return TraceContext::NewTrace();
  absl::StatusOr<TraceContext> sent =
      traceparents.size() == 1
          ? TraceContext::Parse(traceparents[0], absl::StrJoin(tracestates, ","))
          : absl::InvalidArgumentError(
                absl::StrCat("the request carries ", traceparents.size(), " traceparents"));
  if (!sent.ok()) {
    // The specification: a malformed traceparent starts a new trace, and its tracestate goes
    // with it.
    if (rejected != nullptr) *rejected = sent.status();
    return TraceContext::NewTrace();
  }
  return sent->Child();
}

TraceContext SpanForCall(const grpc::ServerContextBase& context, absl::Status* rejected) {
  const std::multimap<grpc::string_ref, grpc::string_ref>& metadata = context.client_metadata();
  auto values = [&metadata](absl::string_view key) {
    std::vector<absl::string_view> out;
    for (auto [it, end] = metadata.equal_range(grpc::string_ref(key.data(), key.size()));
         it != end; ++it) {
      out.emplace_back(it->second.data(), it->second.size());
    }
    return out;
  };
  return SpanForRequest(values(kTraceparentKey), values(kTracestateKey), rejected);
}

void AddTraceMetadata(const TraceContext& span, grpc::ClientContext* context) {
  context->AddMetadata(std::string(kTraceparentKey), span.traceparent());
  if (!span.tracestate().empty()) {
    context->AddMetadata(std::string(kTracestateKey), span.tracestate());
  }
}

std::string ParentOf(const TraceContext& span) {
  return span.parent_id().empty() ? "" : absl::StrCat(" (parent span ", span.parent_id(), ")");
}

}  // namespace tandem
