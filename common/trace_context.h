// W3C Trace Context (https://www.w3.org/TR/trace-context/): the `traceparent` and `tracestate`
// values with which one request is followed across the router, a decode worker and a prefill
// worker, in HTTP headers and gRPC metadata (docs/tracing.md).
//
//   traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
//                ^^ ^^ trace id (16 bytes, hex)       ^^ parent id      ^^ flags
//                version                              (8 bytes, hex)
//
// Every process that handles a request is one span of its trace: it keeps the trace id it was
// given, takes a span id of its own (Child), tags its log lines about the request with both
// (TraceTag), and sends its own span id as the parent id to the next process.
//
//   TraceContext span = SpanForRequest(traceparent_header, tracestate_header, &rejected);
//   LOG(INFO) << TraceTag(span) << "placed on decode worker d0";
//   AddTraceMetadata(span, &client_context);  // the next hop's parent is this span
//
// TraceContext is a value type; thread-compatible. The random ids come from a generator per
// thread (or one the caller passes), never from a process-wide lock.
#ifndef TANDEM_COMMON_TRACE_CONTEXT_H_
#define TANDEM_COMMON_TRACE_CONTEXT_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/random/bit_gen_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace grpc {
class ClientContext;
class ServerContextBase;
}  // namespace grpc

namespace tandem {

// The HTTP header and gRPC metadata keys (lowercase, as gRPC requires of metadata keys).
inline constexpr absl::string_view kTraceparentKey = "traceparent";
inline constexpr absl::string_view kTracestateKey = "tracestate";

// The longest tracestate passed on; a longer one is dropped (the specification asks every
// participant to pass on at least 512 characters).
inline constexpr size_t kMaxTracestateBytes = 512;

class TraceContext {
 public:
  // Parses a `traceparent` value (surrounding spaces and tabs ignored) and the request's
  // `tracestate` (empty: none). INVALID_ARGUMENT, saying what is wrong, unless traceparent is
  //   version 00:  exactly "00-<32 hex>-<16 hex>-<2 hex>", or
  //   a later version (01..fe): those four fields first, then nothing or "-" and anything:
  //                the four fields are used and the context goes on as version 00;
  // with lowercase hex only, a trace id and a parent id not all zeros, and version ff invalid.
  // A tracestate over kMaxTracestateBytes, or with a byte outside printable ASCII, is dropped
  // (tracestate() is then empty): it does not make the traceparent invalid.
  static absl::StatusOr<TraceContext> Parse(absl::string_view traceparent,
                                            absl::string_view tracestate = "");

  // The first span of a new trace: random trace and span ids, flags 01 (sampled: every request's
  // key points are logged), no tracestate.
  static TraceContext NewTrace(absl::BitGenRef bits);
  static TraceContext NewTrace();  // this thread's generator

  // The span of the next process: the same trace id, flags and tracestate, a new random span id,
  // and this span's id as its parent_id.
  TraceContext Child(absl::BitGenRef bits) const;
  TraceContext Child() const;  // this thread's generator

  // 32 lowercase hex digits, not all zeros.
  const std::string& trace_id() const { return trace_id_; }
  // This span's id: 16 lowercase hex digits, not all zeros. Sent onwards as the parent id.
  const std::string& span_id() const { return span_id_; }
  uint8_t flags() const { return flags_; }
  // The span id of the process that sent this span's parent: empty for a new trace and for a
  // context as Parse returns it (whose span_id is the sender's).
  const std::string& parent_id() const { return parent_id_; }
  // As received (commas and spaces included); empty when none.
  const std::string& tracestate() const { return tracestate_; }

  // "00-<trace id>-<span id>-<flags>", the value to send onwards and to answer with.
  std::string traceparent() const;

  friend bool operator==(const TraceContext& a, const TraceContext& b) {
    return a.trace_id_ == b.trace_id_ && a.span_id_ == b.span_id_ &&
           a.parent_id_ == b.parent_id_ && a.flags_ == b.flags_ && a.tracestate_ == b.tracestate_;
  }

 private:
  TraceContext() = default;

  std::string trace_id_;
  std::string span_id_;
  std::string parent_id_;
  uint8_t flags_ = 0;
  std::string tracestate_;
};

// This process's span of a request whose peer sent the `traceparent` values `traceparents`
// (HTTP headers or gRPC metadata entries: none, one, or several, which is malformed) and the
// `tracestate` values `tracestates` (joined with commas, as repeated HTTP headers combine): a
// Child of what was sent, or, when nothing or a malformed traceparent was sent, the first span
// of a new trace. `rejected` (may be null) is set to why a traceparent that was sent could not be
// used (INVALID_ARGUMENT), else to OK.
TraceContext SpanForRequest(absl::Span<const absl::string_view> traceparents,
                            absl::Span<const absl::string_view> tracestates,
                            absl::Status* rejected);

// The same, from a gRPC call's client metadata.
TraceContext SpanForCall(const grpc::ServerContextBase& context, absl::Status* rejected);

// Sends `span` to the next process on an outgoing call: `traceparent` with span.span_id() as the
// parent id, and `tracestate` when there is one. Before the call starts.
void AddTraceMetadata(const TraceContext& span, grpc::ClientContext* context);

// `LOG(INFO) << TraceTag(span) << ...` starts the message with "trace_id=<32 hex>
// span_id=<16 hex> ", the fields that find a request's lines in every process's log. Holds a
// reference: use it inside the log statement only.
class TraceTag {
 public:
  explicit TraceTag(const TraceContext& span) : span_(span) {}
  friend std::ostream& operator<<(std::ostream& os, const TraceTag& tag) {
    return os << "trace_id=" << tag.span_.trace_id() << " span_id=" << tag.span_.span_id() << ' ';
  }

 private:
  const TraceContext& span_;
};

// For a request's first log line in a process, which ties its span to the sender's:
// " (parent span <16 hex>)", or "" for a new trace.
std::string ParentOf(const TraceContext& span);

}  // namespace tandem

#endif  // TANDEM_COMMON_TRACE_CONTEXT_H_
