// The router's request path, shared by its gRPC and HTTP frontends: validate and tokenize a
// request, hash its prompt's blocks (docs/block_hashing.md), place it (placement policy over the
// registry), open Decode.Generate on the chosen decode worker with the ranked prefill workers, and
// relay the responses. Streams are relayed with gRPC's callback API: no thread per request. A
// request whose decode worker fails mid-stream moves to another one and its stream goes on.
//
// Drainable (common/serve.h): once draining, a new request is refused with UNAVAILABLE "router is
// draining" (and a retry-after hint); the requests in flight, from both frontends, go on to their
// end, and HandOff cuts those still running with UNAVAILABLE (router/server/in_flight.h).
#ifndef TANDEM_ROUTER_SERVER_REQUEST_ROUTER_H_
#define TANDEM_ROUTER_SERVER_REQUEST_ROUTER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/keepalive.h"
#include "common/serve.h"
#include "common/trace_context.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "router/placement/admission.h"
#include "router/placement/placement.h"
#include "router/server/admission_queue.h"
#include "router/server/decode_relay.h"
#include "router/server/in_flight.h"
#include "router/server/registry.h"
#include "router/server/relayed_call.h"
#include "router/server/stall_watch.h"
#include "router/server/tool_calls.h"
#include "tandem/v1/inference.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

// Counts a request refused before placement (bad input, no worker) in the router's metrics.
void CountRejected();

struct RouterOptions {
  // The model file whose tokenizer and chat template the router uses (the workers' model).
  std::string model_path;
  std::string policy = "kv_aware";
  placement::PolicyOptions policy_options;
  // A request's deadline when the client sets none.
  absl::Duration default_deadline = absl::Minutes(10);
  // How long a decode worker waits for a prefill worker before trying the next.
  absl::Duration prefill_timeout = absl::Seconds(30);
  // How many times a request may move to another decode worker after its own failed.
  int max_migrations = 2;
  // Admission by SLO and priority (router/placement/admission.h): requests the placement
  // predicts cannot meet their objectives wait in a bounded queue or are refused with
  // RESOURCE_EXHAUSTED and a retry-after hint. Only predicting policies (slo) are affected.
  placement::AdmissionOptions admission = {};
  // How often the admission queue is looked at again for requests that now fit.
  absl::Duration admission_poll = absl::Milliseconds(10);
  // Of the channels to the decode workers (common/keepalive.h): a cut link fails their streams
  // within keepalive.time + keepalive.timeout, and the requests move.
  KeepaliveOptions keepalive = {};
  // Of the channels to the decode workers (common/tls.h): plaintext or (mutual) TLS.
  ChannelSecurity security = {};
  // A decode worker that sends neither a token nor a heartbeat for this long on a stream is taken
  // to have failed for it: the request moves to another decode worker, or ends with UNAVAILABLE
  // (router/server/stall_watch.h). Above the workers' --stream_heartbeat_ms; InfiniteDuration:
  // never.
  absl::Duration stream_stall_timeout = absl::Seconds(6);
  // The time of the stall watch, the admission queue and the relays' measurements (not of
  // deadlines, which are gRPC's, on the system clock). The registry's (RegistryOptions::clock).
  // Must outlive the router.
  Clock* clock = RealClock();
};

class WaitingCall;

class RequestRouter final : public RelayHost, public Drainable {
 public:
  // Reads the model file's tokenizer and starts the admission queue and the stall watch.
  // INVALID_ARGUMENT for options out of range, or a clock other than the registry's.
  static absl::StatusOr<std::unique_ptr<RequestRouter>> Create(const RouterOptions& options,
                                                               Registry* registry);
  // Stops the admission queue's thread and refuses what still waits there (RESOURCE_EXHAUSTED),
  // cancels the requests still in flight and waits for their ends, then for every relay's
  // Decode.Generate call to be gone (DecodeStreams) before the stubs and their channels go.
  ~RequestRouter();

  // A request checked and tokenized.
  struct Prepared {
    v1::GenerateRequest request;
    std::vector<int32_t> tokens;
    // The router's span of the request's trace (common/trace_context.h): its log lines carry it
    // and the decode worker gets it as its parent.
    TraceContext trace;
  };
  // `trace`: the router's span of the request (its frontend continued the client's trace or
  // started one). INVALID_ARGUMENT (empty prompt, over the context, bad sampling), NOT_FOUND
  // (unknown model), UNAVAILABLE (no worker ready yet; the router drains), each with a message
  // for the client.
  absl::StatusOr<Prepared> Prepare(const v1::GenerateRequest& request, const TraceContext& trace);
  // Places and starts `prepared`; `sink` must outlive the call's OnDone. Errors before anything
  // started (no worker; RESOURCE_EXHAUSTED with a retry-after hint when admission refuses it)
  // are returned, and the sink is not called; so is UNAVAILABLE when the router drains. The call
  // may be queued (RelayedCall::queued). It is in flight until its sink's OnDone returned.
  absl::StatusOr<std::shared_ptr<RelayedCall>> Start(Prepared prepared, ResponseSink* sink,
                                                     absl::Time deadline = absl::InfiniteFuture());

  absl::StatusOr<v1::TokenizeResponse> Tokenize(const v1::TokenizeRequest& request);
  v1::ListModelsResponse ListModels();
  // The model id clients name (the workers'), or the router's own guess before any worker is up.
  std::string ModelId();
  Registry& registry() override { return *registry_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // The format the model writes tool calls in (chosen once, from its chat template): how its
  // output is parsed and what its call ids look like.
  ToolCallFormat tool_call_format() const { return tool_format_; }

  // Places `request` over the ready workers but those in `avoid` and returns the route and the
  // decode worker's stub (for the relay, also when it migrates a request).
  absl::StatusOr<Route> PlaceForRelay(const placement::Request& request,
                                      const absl::flat_hash_set<std::string>& avoid,
                                      v1::Decode::Stub** stub) override;

  // Queued requests (admission), for tests and metrics.
  int64_t QueuedRequests();
  // Drainable. The work is every request from Start until its sink's OnDone returned; HandOff
  // cancels those still running, and their sinks get UNAVAILABLE ("... cut as the drain
  // ended"): a client cannot carry a stream on at another router, so it sees the error.
  void StartDrain() override;
  bool AwaitIdle(absl::Time deadline) override;
  void HandOff() override;

  // The relays' decode streams, watched for silence.
  StallWatch& stall_watch() override { return *stall_watch_; }
  Clock* clock() const override { return options_.clock; }
  DecodeStreams& decode_streams() override { return decode_streams_; }

 private:
  friend class WaitingCall;
  RequestRouter(const RouterOptions& options, Registry* registry);
  absl::StatusOr<std::vector<int32_t>> Encode(const v1::GenerateRequest& request) const;
  // The chat's prompt text through the model's template, with `tools` (none: empty) shown to the
  // model as tool_style_ says. INVALID_ARGUMENT naming the message for a role other than
  // system/user/assistant/tool, or empty content of a system or user message; and for tools or
  // tool calls when the model's template writes calls in a form Tandem does not parse.
  absl::StatusOr<std::string> RenderChat(const v1::ChatMessages& chat,
                                         const google::protobuf::RepeatedPtrField<v1::Tool>& tools,
                                         bool add_generation_prompt) const;
  absl::StatusOr<Route> PlaceLocked(const placement::Request& request,
                                    const absl::flat_hash_set<std::string>& avoid,
                                    v1::Decode::Stub** stub) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Start, once the request is counted in flight: `sink` is its entry.
  absl::StatusOr<std::shared_ptr<RelayedCall>> PlaceAndStart(Prepared prepared, ResponseSink* sink,
                                                             absl::Time deadline);
  // Opens the relay of a placed request.
  std::shared_ptr<RelayedCall> StartRelay(Route route, v1::Decode::Stub* stub,
                                          const Prepared& prepared, const placement::Request& req,
                                          ResponseSink* sink, absl::Time arrival,
                                          absl::Time deadline);

  const RouterOptions options_;
  Registry* const registry_;
  std::unique_ptr<Tokenizer> tokenizer_;
  absl::StatusOr<ChatTemplate> chat_template_;
  // How tools and tool calls reach the prompt (docs/api.md, "Function calling"): kTemplate, the
  // model's Jinja template takes `tools` and writes calls in a format Tandem parses
  // (ToolCallFormatOfTemplate); kFallback, its template takes no tools and Tandem writes them as
  // text (a system message, <tool_call> blocks, tool results as user messages in
  // <tool_response>); kUnsupported, its template takes tools in another form, which is refused.
  enum class ToolStyle { kTemplate, kFallback, kUnsupported };
  ToolStyle tool_style_ = ToolStyle::kFallback;
  // The format the model writes calls in: the template's (kTemplate), else kHermes.
  ToolCallFormat tool_format_ = ToolCallFormat::kHermes;
  std::string file_model_id_;
  int64_t file_max_context_ = 0;
  std::string file_architecture_;  // "llama", "qwen2", ...; empty when the files do not say
  std::string file_format_;        // "gguf" or "hf" (ModelInfo.format)
  int64_t loaded_unix_s_ = 0;      // when Create read the model (ModelInfo.created_unix_s)
  absl::Mutex mu_;
  std::unique_ptr<placement::PlacementPolicy> policy_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<v1::Decode::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  // The relays' calls on stubs_' channels; none is open when the destructor lets stubs_ go.
  DecodeStreams decode_streams_;
  // Before the admission queue and the stall watch: it outlives the requests they end.
  InFlightRequests in_flight_;
  std::unique_ptr<AdmissionQueue> admission_;
  std::unique_ptr<StallWatch> stall_watch_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_REQUEST_ROUTER_H_
