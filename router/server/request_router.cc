#include "router/server/request_router.h"

#include <cmath>
#include <filesystem>
#include <system_error>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_conversion.h"
#include "common/status_macros.h"
#include "engine/kv/block_hash.h"
#include "engine/model/gguf.h"
#include "engine/model/hf_config.h"
#include "engine/sampling/sampling_options.h"
#include "proto/conversion.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "grpcpp/create_channel.h"
#include "router/server/decode_relay.h"
#include "router/server/planner_advisor.h"
#include "router/server/router_metrics.h"
#include "router/server/tool_calls.h"

namespace tandem::router {

void CountRejected() { Metrics().requests.Add({{"outcome", "rejected"}}).Increment(); }

RequestRouter::RequestRouter(const RouterOptions& options, Registry* registry)
    : options_(options), registry_(registry), chat_template_(absl::NotFoundError("no template")) {}

absl::StatusOr<std::unique_ptr<RequestRouter>> RequestRouter::Create(const RouterOptions& options,
                                                                     Registry* registry) {
  auto router = std::unique_ptr<RequestRouter>(new RequestRouter(options, registry));
  ASSIGN_OR_RETURN(router->tokenizer_, TokenizerForModel(options.model_path));
  router->chat_template_ = ChatTemplate::ForModel(*router->tokenizer_);
  if (!router->chat_template_.ok()) {
    LOG(WARNING) << options.model_path << ": chat requests will be refused: "
                 << router->chat_template_.status().message();
  } else if (const std::string& jinja = router->tokenizer_->data().chat_template;
             router->chat_template_->kind() == ChatTemplateKind::kJinja &&
             absl::StrContains(jinja, "tools")) {
    const std::optional<ToolCallFormat> format = ToolCallFormatOfTemplate(jinja);
    router->tool_style_ = format.has_value() ? ToolStyle::kTemplate : ToolStyle::kUnsupported;
    router->tool_format_ = format.value_or(ToolCallFormat::kHermes);
    LOG(INFO) << options.model_path << ": tools "
              << (format.has_value()
                      ? absl::StrCat("in the chat template's ", ToolCallFormatName(*format),
                                     " call format")
                      : std::string("refused (a call format Tandem does not parse)"));
  }
  router->file_model_id_ = std::filesystem::path(options.model_path).stem().string();
  router->loaded_unix_s_ = absl::ToUnixSeconds(options.clock->Now());
  std::error_code ec;
  if (std::filesystem::is_directory(options.model_path, ec)) {  // a Hugging Face folder
    router->file_format_ = "hf";
    absl::StatusOr<ModelConfig> config = LoadHfConfig(options.model_path + "/config.json");
    if (config.ok()) {
      router->file_max_context_ = config->max_context;
      router->file_architecture_ = config->architecture;
    }
  } else {
    router->file_format_ = "gguf";
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(options.model_path));
    absl::StatusOr<absl::string_view> arch = file->GetString("general.architecture");
    if (arch.ok()) {
      router->file_architecture_ = std::string(*arch);
      absl::StatusOr<uint32_t> context = file->GetUint32(absl::StrCat(*arch, ".context_length"));
      if (context.ok()) router->file_max_context_ = *context;
    }
  }
  {
    absl::MutexLock lock(&router->mu_);
    ASSIGN_OR_RETURN(router->policy_,
                     placement::CreatePolicy(options.policy, options.policy_options));
  }
  ASSIGN_OR_RETURN(router->admission_,
                   AdmissionQueue::Create({.admission = options.admission,
                                           .poll = options.admission_poll,
                                           .clock = options.clock}));
  if (options.stream_stall_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the stream stall timeout must be positive");
  }
  RETURN_IF_ERROR(ValidateKeepalive(options.keepalive));
  if (options.clock != registry->clock()) {
    return absl::InvalidArgumentError(
        "the router's clock must be its registry's: the relays report progress in it");
  }
  router->stall_watch_ = std::make_unique<StallWatch>(
      StallWatch::Options{.timeout = options.stream_stall_timeout,
                          .period = std::min(absl::Milliseconds(250), options.stream_stall_timeout / 4),
                          .clock = options.clock});
  router->stall_watch_->Start();
  router->admission_->Start();
  return router;
}

std::string RequestRouter::ModelId() {
  const std::optional<Registry::ModelInfo> model = registry_->Model();
  return model.has_value() ? model->model_id : file_model_id_;
}

absl::StatusOr<std::string> RequestRouter::RenderChat(
    const v1::ChatMessages& chat, const google::protobuf::RepeatedPtrField<v1::Tool>& tools,
    bool add_generation_prompt) const {
  if (!chat_template_.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has no usable chat template: ", chat_template_.status().message()));
  }
  bool has_calls = false;
  std::vector<ChatMessage> messages;
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    const std::string at = absl::StrCat("messages[", i, "]");
    if (m.role() != "system" && m.role() != "user" && m.role() != "assistant" &&
        m.role() != "tool") {
      return WithParam(absl::InvalidArgumentError(
                           absl::StrCat("chat.", at, ".role '", m.role(),
                                        "' is not system, user, assistant or tool")),
                       at + ".role");
    }
    // A system or user message says something; an assistant's may be empty (an empty reply, or
    // only calls), and so may a function's result.
    if (m.content().empty() && (m.role() == "system" || m.role() == "user")) {
      return WithParam(absl::InvalidArgumentError(absl::StrCat("chat.", at, ".content of a ",
                                                               m.role(), " message is empty")),
                       at + ".content");
    }
    ChatMessage message{.role = m.role(), .content = m.content(), .tool_calls = {},
                        .tool_call_id = m.tool_call_id(), .name = m.name()};
    for (const v1::ToolCall& c : m.tool_calls()) {
      message.tool_calls.push_back({.id = c.id(), .name = c.name(), .arguments = c.arguments()});
    }
    has_calls = has_calls || !m.tool_calls().empty() || m.role() == "tool";
    messages.push_back(std::move(message));
  }
  if (messages.empty()) {
    return WithParam(absl::InvalidArgumentError("the chat has no messages"), "messages");
  }
  ChatTemplate::RenderOptions options = ChatTemplate::OptionsFor(*tokenizer_);
  options.add_generation_prompt = add_generation_prompt;
  if (tool_style_ == ToolStyle::kUnsupported && (!tools.empty() || has_calls)) {
    return WithParam(absl::InvalidArgumentError(
                         "the model's chat template writes tool calls in a form Tandem does not "
                         "parse (Hermes <tool_call> blocks, Llama 3.1+ JSON and Mistral "
                         "[TOOL_CALLS] lists are)"),
                     tools.empty() ? "messages" : "tools");
  }
  if (tool_style_ == ToolStyle::kTemplate) {
    if (!tools.empty()) {
      ASSIGN_OR_RETURN(options.tools, JinjaValueFromJson(ToolsJson(tools)));
    }
    return chat_template_->Render(messages, options);
  }
  // kFallback: the tools in a system message, calls and results as text.
  for (ChatMessage& m : messages) {
    if (!m.tool_calls.empty()) {
      for (const ChatToolCall& c : m.tool_calls) {
        if (!m.content.empty()) m.content += "\n";
        m.content += ToolCallText(c.name, c.arguments);
      }
      m.tool_calls.clear();
    }
    if (m.role == "tool") {
      m = {.role = "user", .content = absl::StrCat("<tool_response>\n", m.content,
                                                    "\n</tool_response>")};
    }
  }
  if (!tools.empty()) {
    const std::string prompt = FallbackToolsPrompt(tools);
    if (messages[0].role == "system") {
      messages[0].content = absl::StrCat(messages[0].content, "\n\n", prompt);
    } else {
      messages.insert(messages.begin(), ChatMessage{.role = "system", .content = prompt});
    }
  }
  return chat_template_->Render(messages, options);
}

absl::StatusOr<std::vector<int32_t>> RequestRouter::Encode(const v1::GenerateRequest& r) const {
  switch (r.input_case()) {
    case v1::GenerateRequest::kPrompt:
      return tokenizer_->Encode(r.prompt(), {.add_special = true, .parse_special = true});
    case v1::GenerateRequest::kChat: {
      // tool_choice "none": the tools are not shown.
      static const google::protobuf::RepeatedPtrField<v1::Tool> kNoTools;
      ASSIGN_OR_RETURN(std::string text,
                       RenderChat(r.chat(),
                                  EffectiveToolChoice(r) == v1::ToolChoice::MODE_NONE ? kNoTools
                                                                                      : r.tools(),
                                  /*add_generation_prompt=*/true));
      return tokenizer_->Encode(text, {.add_special = false, .parse_special = true});
    }
    case v1::GenerateRequest::kTokenIds:
      return std::vector<int32_t>(r.token_ids().ids().begin(), r.token_ids().ids().end());
    default:
      return absl::InvalidArgumentError("the request has no prompt, chat or token ids");
  }
}

absl::StatusOr<RequestRouter::Prepared> RequestRouter::Prepare(const v1::GenerateRequest& request,
                                                               const TraceContext& trace) {
  if (in_flight_.draining()) return InFlightRequests::Refusal();  // Start checks it again
  const std::optional<Registry::ModelInfo> model = registry_->Model();
  const std::string model_id = model.has_value() ? model->model_id : file_model_id_;
  if (!request.model().empty() && request.model() != model_id) {
    return WithParam(absl::NotFoundError(absl::StrCat("model '", request.model(),
                                                      "' does not exist; this cluster serves '",
                                                      model_id, "'")),
                     "model");
  }
  RETURN_IF_ERROR(ValidateTools(request));
  Prepared p{.request = request, .tokens = {}, .trace = trace};
  if (ConstrainsToolCalls(request)) {
    // The calls' grammar, compiled by the worker that samples.
    p.request.mutable_sampling()->mutable_response_format()->set_structural_tag(
        ToolCallStructuralTag(request, tool_format_));
  }
  ASSIGN_OR_RETURN(p.tokens, Encode(request));
  if (p.tokens.empty()) {
    return WithParam(absl::InvalidArgumentError("the prompt is empty"), "prompt");
  }
  const int64_t vocab = tokenizer_->vocab_size();
  for (int32_t t : p.tokens) {
    if (t < 0 || t >= vocab) {
      return WithParam(absl::InvalidArgumentError(absl::StrCat(
                           "prompt token id ", t, " is outside the vocabulary [0, ", vocab, ")")),
                       "prompt");
    }
  }
  const int64_t context = model.has_value() ? model->max_context : file_max_context_;
  const sampling::SamplingOptions s = SamplingFromProto(request.sampling());
  if (request.sampling().has_max_tokens() && request.sampling().max_tokens() == 0) {
    return absl::InvalidArgumentError("max_tokens must be at least 1");
  }
  RETURN_IF_ERROR(
      sampling::ValidateSamplingOptions(s, static_cast<int>(vocab), static_cast<int>(context)));
  if (request.sampling().prompt_logprobs() > sampling::kMaxLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_logprobs must be in [0, ",
                                                   sampling::kMaxLogprobs, "], got ",
                                                   request.sampling().prompt_logprobs()));
  }
  if (absl::Status length = sampling::ValidatePromptLength(
          s, static_cast<int64_t>(p.tokens.size()), static_cast<int>(context));
      !length.ok()) {
    // Over the context: the prompt alone, or with the tokens asked for.
    const bool alone = static_cast<int64_t>(p.tokens.size()) >= context;
    return WithParam(length, alone ? "prompt" : "max_tokens");
  }
  if (request.request_id().empty()) {
    static std::atomic<uint64_t> next{1};
    p.request.set_request_id(
        absl::StrCat("req-", absl::ToUnixMicros(options_.clock->Now()), "-", next++));
  }
  return p;
}

// A request offered to the admission queue (RequestRouter::Start): started at once on the
// placement it holds (StartNow), or, when it is queued, a RelayedCall that becomes a DecodeRelay
// when the queue starts it, or ends with RESOURCE_EXHAUSTED, or with CANCELLED when its client
// cancels it first.
class WaitingCall final : public RelayedCall, public WaitingRequest {
 public:
  WaitingCall(RequestRouter* router, RequestRouter::Prepared prepared, placement::Request req,
              ResponseSink* sink, absl::Time arrival, absl::Time deadline)
      : router_(router),
        prepared_(std::move(prepared)),
        req_(std::move(req)),
        sink_(sink),
        arrival_(arrival),
        deadline_(deadline) {}

  bool queued() const override { return true; }

  void Cancel() override {
    std::shared_ptr<RelayedCall> relay;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      relay = relay_;
    }
    if (relay != nullptr) return relay->Cancel();
    if (router_->admission_->Remove(this)) {
      LOG(INFO) << TraceTag(prepared_.trace) << "request " << prepared_.request.request_id()
                << ": cancelled by its client while it waited for admission";
      sink_->OnDone(absl::CancelledError("the client cancelled the request while it waited"));
    }
    // Else it is starting: Start below sees cancelled_.
  }

  // WaitingRequest. Place, Unplace and Start are called by one thread at a time (Start's caller,
  // then the admission queue's pump that holds the request), so placed_ needs no lock.
  absl::StatusOr<placement::SloPrediction> Place() override {
    v1::Decode::Stub* stub;
    ASSIGN_OR_RETURN(Route route, router_->PlaceForRelay(req_, {}, &stub));
    req_.placed_before = true;  // every later placement of it is a re-placement
    placed_.emplace(Placed{std::move(route), stub});
    return placement::PredictionOf(placed_->route.decision);
  }
  void Unplace() override {
    router_->registry().Release(placed_->route);
    placed_.reset();
  }
  // Out of the queue: run it on its placement.
  void Start() override {
    sink_->OnAdmitted();
    std::shared_ptr<RelayedCall> relay = StartNow();
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      relay_ = relay;
      cancelled = cancelled_;
    }
    if (cancelled) relay->Cancel();
  }
  void Refuse(const absl::Status& status) override {
    LOG(INFO) << TraceTag(prepared_.trace) << "request " << prepared_.request.request_id()
              << ": refused after waiting for admission: " << status;
    CountRejected();
    sink_->OnDone(status);
  }

  // Starts the relay on the placement Place holds.
  std::shared_ptr<RelayedCall> StartNow() {
    std::shared_ptr<RelayedCall> relay =
        router_->StartRelay(std::move(placed_->route), placed_->stub, prepared_, req_, sink_,
                            arrival_, deadline_);
    placed_.reset();
    return relay;
  }

 private:
  struct Placed {
    Route route;
    v1::Decode::Stub* stub;
  };

  RequestRouter* const router_;
  const RequestRouter::Prepared prepared_;
  placement::Request req_;
  ResponseSink* const sink_;
  const absl::Time arrival_;
  const absl::Time deadline_;
  std::optional<Placed> placed_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<RelayedCall> relay_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::shared_ptr<RelayedCall>> RequestRouter::Start(Prepared p, ResponseSink* sink,
                                                                  absl::Time deadline) {
  ASSIGN_OR_RETURN(const std::shared_ptr<InFlightRequests::Entry> entry, in_flight_.Enter(sink));
  absl::StatusOr<std::shared_ptr<RelayedCall>> call =
      PlaceAndStart(std::move(p), entry.get(), deadline);
  if (!call.ok()) {
    in_flight_.Abandon(*entry);
    return call.status();
  }
  in_flight_.Started(*entry, *call);
  return call;
}

void RequestRouter::StartDrain() {
  const int64_t n = in_flight_.StartDrain();
  LOG(INFO) << "draining: new requests are refused; " << n << " in flight may finish";
}

bool RequestRouter::AwaitIdle(absl::Time deadline) { return in_flight_.AwaitIdle(deadline); }

void RequestRouter::HandOff() {
  if (const int64_t n = in_flight_.Cut(); n > 0) {
    LOG(WARNING) << "cutting " << n << " requests still in flight";
  }
}

absl::StatusOr<std::shared_ptr<RelayedCall>> RequestRouter::PlaceAndStart(Prepared p,
                                                                          ResponseSink* sink,
                                                                          absl::Time deadline) {
  const absl::Time begin = options_.clock->Now();
  if (ObservedWorkload* w = RouterWorkload()) w->Arrived();
  const std::optional<Registry::ModelInfo> model = registry_->Model();
  if (!model.has_value()) return absl::UnavailableError("no decode worker is ready");
  placement::Request req;
  req.prompt_tokens = static_cast<int64_t>(p.tokens.size());
  req.block_size = model->block_size;
  req.block_hashes = HashFullBlocks(ModelIdHash(model->model_id), p.tokens, model->block_size);
  req.priority = p.request.priority();
  req.slo = {.ttft_ms = p.request.slo().ttft_ms(), .tpot_ms = p.request.slo().tpot_ms()};
  req.max_tokens = p.request.sampling().has_max_tokens()
                       ? static_cast<int64_t>(p.request.sampling().max_tokens())
                       : 0;
  // The deadline goes to gRPC, whose deadlines are on the system clock.
  if (deadline == absl::InfiniteFuture()) deadline = absl::Now() + options_.default_deadline;
  auto call = std::make_shared<WaitingCall>(this, std::move(p), req, sink, begin, deadline);
  ASSIGN_OR_RETURN(const placement::SloPrediction prediction, call->Place());
  ASSIGN_OR_RETURN(const placement::Outcome outcome,
                   admission_->Offer(call, {.priority = req.priority,
                                            .arrival = begin,
                                            .prediction = prediction}));
  Metrics().overhead.Observe(absl::ToDoubleSeconds(options_.clock->Now() - begin));
  if (outcome == placement::Outcome::kQueue) return std::shared_ptr<RelayedCall>(call);
  return call->StartNow();
}

std::shared_ptr<RelayedCall> RequestRouter::StartRelay(Route route, v1::Decode::Stub* stub,
                                                       const Prepared& p,
                                                       const placement::Request& req,
                                                       ResponseSink* sink, absl::Time arrival,
                                                       absl::Time deadline) {
  v1::DecodeRequest d;
  d.set_request_id(p.request.request_id());
  d.set_model(p.request.model().empty() ? ModelId() : p.request.model());
  d.mutable_prompt_token_ids()->Add(p.tokens.begin(), p.tokens.end());
  *d.mutable_sampling() = p.request.sampling();
  *d.mutable_slo() = p.request.slo();
  d.set_priority(p.request.priority());
  d.set_omit_text(p.request.omit_text());
  d.set_prefill_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.prefill_timeout)));
  for (const auto& [id, address] : route.prefill) {
    v1::PrefillTarget* t = d.add_prefill_targets();
    t->set_worker_id(id);
    t->set_address(address);
  }
  return StartDecodeRelay(this,
                          {.route = std::move(route),
                           .stub = stub,
                           .request = std::move(d),
                           .trace = p.trace,
                           .placement = req,
                           .arrival = arrival,
                           .deadline = deadline,
                           .max_migrations = options_.max_migrations},
                          sink);
}

int64_t RequestRouter::QueuedRequests() { return admission_->size(); }

RequestRouter::~RequestRouter() {
  admission_.reset();  // refuses what waits while the rest of the router is still whole
  // A request's end reaches its sink before its relay lets go of its call: the thread that
  // delivered it still destroys the call's ClientContext afterwards. Channels and gRPC itself
  // must outlive that (main's drain returns as soon as the sinks are done), so wait for it.
  if (const int64_t cut = in_flight_.Cut(); cut > 0) {
    LOG(WARNING) << "cutting " << cut << " requests still in flight as the router stops";
  }
  // Cancelled calls end locally at once, whatever their peers do; the bound only keeps a bug here
  // from turning a stop into a hang.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  if (!in_flight_.AwaitIdle(deadline) || !decode_streams_.AwaitNone(deadline)) {
    LOG(ERROR) << "requests or decode calls still open 10 s after they were cut; stopping anyway";
  }
}

absl::StatusOr<Route> RequestRouter::PlaceForRelay(const placement::Request& request,
                                                   const absl::flat_hash_set<std::string>& avoid,
                                                   v1::Decode::Stub** stub) {
  absl::MutexLock lock(&mu_);
  return PlaceLocked(request, avoid, stub);
}

absl::StatusOr<Route> RequestRouter::PlaceLocked(const placement::Request& request,
                                                 const absl::flat_hash_set<std::string>& avoid,
                                                 v1::Decode::Stub** stub) {
  absl::StatusOr<Route> route = registry_->Place(*policy_, request, avoid);
  if (!route.ok()) return route.status();
  Metrics()
      .placements
      .Add({{"policy", std::string(policy_->name())},
            {"prefill", route->decision.local_prefill ? "local" : "remote"},
            {"reason", std::string(placement::PrefillReasonName(route->decision.reason))}})
      .Increment();
  auto& slot = stubs_[route->decode_address];
  if (slot == nullptr) {
    slot = v1::Decode::NewStub(CreateKeepaliveChannel(route->decode_address, options_.keepalive,
                                                        options_.security));
  }
  *stub = slot.get();
  return route;
}

absl::StatusOr<v1::TokenizeResponse> RequestRouter::Tokenize(const v1::TokenizeRequest& request) {
  const std::string model_id = ModelId();
  if (!request.model().empty() && request.model() != model_id) {
    return WithParam(
        absl::NotFoundError(absl::StrCat("model '", request.model(), "' does not exist")),
        "model");
  }
  std::vector<int32_t> ids;
  if (request.has_chat()) {
    v1::GenerateRequest as_generate;
    *as_generate.mutable_chat() = request.chat();
    *as_generate.mutable_tools() = request.tools();
    RETURN_IF_ERROR(ValidateTools(as_generate));
    ASSIGN_OR_RETURN(std::string text,
                     RenderChat(request.chat(), request.tools(),
                                request.has_add_generation_prompt()
                                                    ? request.add_generation_prompt()
                                                    : true));
    // The template writes the special tokens it wants: none added by default.
    ids = tokenizer_->Encode(text, {.add_special = request.has_add_special_tokens() &&
                                                   request.add_special_tokens(),
                                    .parse_special = true});
  } else {
    ids = tokenizer_->Encode(request.prompt(),
                             {.add_special = request.has_add_special_tokens() ? request.add_special_tokens() : true,
                              .parse_special = true});
  }
  v1::TokenizeResponse response;
  response.mutable_token_ids()->Add(ids.begin(), ids.end());
  if (request.return_pieces()) {
    for (int32_t id : ids) response.add_pieces(tokenizer_->TokenBytes(id));
  }
  const std::optional<Registry::ModelInfo> model = registry_->Model();
  response.set_max_model_len(
      static_cast<uint32_t>(model.has_value() ? model->max_context : file_max_context_));
  return response;
}

v1::ListModelsResponse RequestRouter::ListModels() {
  v1::ListModelsResponse response;
  v1::ModelInfo* m = response.add_models();
  m->set_id(ModelId());
  const std::optional<Registry::ModelInfo> model = registry_->Model();
  m->set_max_context(static_cast<uint32_t>(model.has_value() ? model->max_context : file_max_context_));
  m->set_vocab_size(static_cast<uint32_t>(tokenizer_->vocab_size()));
  m->set_owned_by("tandem");
  m->set_architecture(file_architecture_);
  m->set_format(file_format_);
  m->set_created_unix_s(loaded_unix_s_);
  return response;
}

}  // namespace tandem::router
