#include "proto/testing/sample_messages.h"

#include <cstdint>
#include <limits>
#include <utility>

namespace tandem::proto_testing {
namespace {

constexpr char kRequestId[] = "req-0001";
constexpr char kModel[] = "smollm2-135m-instruct";

// Block hashes with the high bit set and all bits set: fixed64 must not be sign-mangled.
constexpr uint64_t kHashA = 0xFEDCBA9876543210ULL;
constexpr uint64_t kHashB = 0x0123456789ABCDEFULL;
constexpr uint64_t kHashC = std::numeric_limits<uint64_t>::max();

// Bytes that are not valid UTF-8 (NUL, 0xFE, 0xFF, a lone continuation byte).
std::string NonUtf8Bytes(const char* tail) {
  std::string bytes("\x00\x01\xfe\xff\x80", 5);
  bytes += tail;
  return bytes;
}

v1::Slo SampleSlo() {
  v1::Slo slo;
  slo.set_ttft_ms(500);
  slo.set_tpot_ms(50);
  return slo;
}

v1::TokenLogprobs SampleTokenLogprobs(int32_t token_id) {
  v1::TokenLogprobs logprobs;
  logprobs.set_token_id(token_id);
  logprobs.set_logprob(-0.25F);
  v1::TopLogprob* top = logprobs.add_top_logprobs();
  top->set_token_id(token_id);
  top->set_logprob(-0.25F);
  top = logprobs.add_top_logprobs();
  top->set_token_id(42);
  top->set_logprob(-1.5F);
  return logprobs;
}

v1::Usage SampleUsage() {
  v1::Usage usage;
  usage.set_prompt_tokens(17);
  usage.set_completion_tokens(3);
  usage.set_cached_prompt_tokens(16);
  return usage;
}

v1::Timings SampleTimings() {
  v1::Timings timings;
  timings.set_queue_us(1200);
  timings.set_ttft_us(45000);
  timings.set_e2e_us(9000000000ULL);  // Above 2^32.
  timings.set_prefill_us(30000);
  timings.set_kv_transfer_us(2500);
  timings.set_decode_us(120000);
  timings.set_prefill_worker("prefill-0");
  timings.set_decode_worker("decode-1");
  timings.set_remote_prefill(true);
  timings.set_migrations(1);
  timings.set_predicted_ttft_us(120000);
  timings.set_predicted_tpot_us(21000);
  return timings;
}

v1::ToolCall SampleToolCall() {
  v1::ToolCall call;
  call.set_id("call_0");
  call.set_name("get_weather");
  call.set_arguments("{\"city\": \"M\u00fcnchen\"}");
  return call;
}

v1::ChatMessages SampleChat() {
  v1::ChatMessages chat;
  v1::ChatMessage* message = chat.add_messages();
  message->set_role("system");
  message->set_content("You are terse.");
  message = chat.add_messages();
  message->set_role("user");
  message->set_content("Hi \u2014 how are you? \U0001F600");
  message = chat.add_messages();
  message->set_role("assistant");
  *message->add_tool_calls() = SampleToolCall();
  message = chat.add_messages();
  message->set_role("tool");
  message->set_tool_call_id("call_0");
  message->set_name("get_weather");
  message->set_content("{\"celsius\": -3.5}");
  return chat;
}

v1::Tool SampleTool() {
  v1::Tool tool;
  tool.set_name("get_weather");
  tool.set_description("The weather in a city \u2600");
  tool.set_parameters(R"({"type": "object", "properties": {"city": {"type": "string"}}})");
  tool.set_strict(true);
  return tool;
}

v1::StepTiming SampleStepTiming(uint32_t batch_size, uint32_t prefill_tokens) {
  v1::StepTiming step;
  step.set_batch_size(batch_size);
  step.set_prefill_tokens(prefill_tokens);
  step.set_decode_tokens(batch_size - 1);
  step.set_context_tokens(70000);
  step.set_duration_us(18000);
  step.set_attended_tokens(70400);
  step.set_prompt_attended_tokens(400);
  return step;
}

template <typename T>
SampleMessage Sample(std::string label, T message) {
  return SampleMessage{std::move(label), std::make_unique<T>(std::move(message))};
}

}  // namespace

v1::SamplingParams SampleSamplingParams() {
  v1::SamplingParams sampling;
  sampling.set_max_tokens(256);
  sampling.set_temperature(0.75F);
  sampling.set_top_p(0.5F);
  sampling.set_min_p(0.0F);  // Set to zero: present, unlike unset.
  sampling.set_top_k(40);
  sampling.set_repetition_penalty(1.25F);
  sampling.set_frequency_penalty(-0.5F);
  sampling.set_presence_penalty(1.5F);
  sampling.set_seed(std::numeric_limits<uint64_t>::max());
  sampling.add_stop("\n\n");
  sampling.add_stop("Ende \U0001F6D1");
  sampling.add_stop_token_ids(2);
  sampling.add_stop_token_ids(128009);
  sampling.set_ignore_eos(true);
  sampling.set_min_tokens(0);  // Set to zero.
  sampling.set_logprobs(5);
  sampling.set_prompt_logprobs(3);
  return sampling;
}

v1::GenerateRequest SampleGenerateRequest(v1::GenerateRequest::InputCase input) {
  v1::GenerateRequest request;
  request.set_request_id(kRequestId);
  request.set_model(kModel);
  switch (input) {
    case v1::GenerateRequest::kPrompt:
      request.set_prompt("Once upon a time, \u00fcn\u00efc\u00f6d\u00e9 \u4e16\u754c \U0001F680");
      break;
    case v1::GenerateRequest::kChat:
      *request.mutable_chat() = SampleChat();
      *request.add_tools() = SampleTool();
      request.mutable_tool_choice()->set_mode(v1::ToolChoice::MODE_FUNCTION);
      request.mutable_tool_choice()->set_function_name("get_weather");
      request.set_parallel_tool_calls(false);  // Set to false: present, unlike unset.
      break;
    case v1::GenerateRequest::kTokenIds:
      for (int32_t id : {1, 15043, 0, std::numeric_limits<int32_t>::max()}) {
        request.mutable_token_ids()->add_ids(id);
      }
      break;
    case v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  *request.mutable_sampling() = SampleSamplingParams();
  *request.mutable_slo() = SampleSlo();
  request.set_priority(-3);  // Negative int32: a 10-byte varint.
  request.set_omit_text(true);
  return request;
}

v1::GenerateResponse SampleGenerateResponse() {
  v1::GenerateResponse response;
  response.set_request_id(kRequestId);
  for (int32_t id : {450, 1492, 2}) {
    response.add_token_ids(id);
    *response.add_logprobs() = SampleTokenLogprobs(id);
  }
  for (int32_t id : {15043, 0}) *response.add_prompt_logprobs() = SampleTokenLogprobs(id);
  response.set_text("The end. \u2713");
  response.set_finish_reason(v1::FINISH_REASON_ERROR);
  *response.mutable_usage() = SampleUsage();
  *response.mutable_timings() = SampleTimings();
  response.set_error_message("decode worker lost");
  *response.add_tool_calls() = SampleToolCall();
  return response;
}

v1::TokenizeRequest SampleTokenizeRequest(v1::TokenizeRequest::InputCase input) {
  v1::TokenizeRequest request;
  request.set_model(kModel);
  switch (input) {
    case v1::TokenizeRequest::kPrompt:
      request.set_prompt("Hello \u4e16\u754c");
      break;
    case v1::TokenizeRequest::kChat:
      *request.mutable_chat() = SampleChat();
      *request.add_tools() = SampleTool();
      request.set_add_generation_prompt(false);  // Set to false: present, unlike unset.
      break;
    case v1::TokenizeRequest::INPUT_NOT_SET:
      break;
  }
  request.set_add_special_tokens(false);  // Set to false: present, unlike unset.
  request.set_return_pieces(true);
  return request;
}

v1::TokenizeResponse SampleTokenizeResponse() {
  v1::TokenizeResponse response;
  response.add_token_ids(1);
  response.add_token_ids(22557);
  response.add_pieces("<s>");
  response.add_pieces(std::string("\xe4\xb8", 2));  // Half of a UTF-8 character.
  response.set_max_model_len(8192);
  return response;
}

v1::ListModelsResponse SampleListModelsResponse() {
  v1::ListModelsResponse response;
  for (const char* id : {kModel, "tinyllama-1.1b-chat"}) {
    v1::ModelInfo* model = response.add_models();
    model->set_id(id);
    model->set_architecture("llama");
    model->set_max_context(8192);
    model->set_vocab_size(49152);
    model->set_created_unix_s(1733140000);
    model->set_owned_by("tandem");
    model->set_format("gguf");
  }
  return response;
}

v1::WatchStateRequest SampleWatchStateRequest() {
  v1::WatchStateRequest request;
  request.set_subscriber("router-0");
  request.set_load_interval_ms(250);
  return request;
}

v1::LoadSample SampleLoadSample() {
  v1::LoadSample load;
  load.set_timestamp_us(1733140000123456ULL);
  load.set_running_seqs(3);
  load.set_waiting_seqs(2);
  load.set_free_blocks(900);
  load.set_used_blocks(124);
  load.set_cached_blocks(300);
  load.set_queued_prefill_tokens(4096);
  load.set_active_decode_tokens(12000);
  *load.add_recent_steps() = SampleStepTiming(4, 512);
  *load.add_recent_steps() = SampleStepTiming(3, 0);
  load.set_prefix_hit_tokens(uint64_t{1} << 40);
  load.set_prompt_tokens((uint64_t{1} << 41) + 7);
  load.set_step_elapsed_us(1700000);
  load.set_finished_seqs(4242);
  load.set_draining(true);
  v1::QueuedClass* high = load.add_queued_by_priority();
  high->set_priority(2);
  high->set_tokens(96);
  high->set_prompts(1);
  v1::QueuedClass* low = load.add_queued_by_priority();
  low->set_priority(-1);
  low->set_tokens(4000);
  low->set_prompts(3);
  return load;
}

v1::KvPoolDescriptor SampleKvPoolDescriptor() {
  v1::KvPoolDescriptor pool;
  pool.set_transport("ucx");
  pool.set_transport_address(NonUtf8Bytes("ucx-worker"));
  v1::MemoryRegion* region = pool.add_regions();
  region->set_base_address(0x7f0000000000ULL);
  region->set_length(uint64_t{1} << 33);
  region->set_remote_key(NonUtf8Bytes("rkey-0"));
  region->set_memory_type(v1::MEMORY_TYPE_CUDA);
  region->set_device_index(1);
  region = pool.add_regions();
  region->set_base_address(0x7f8000000000ULL);
  region->set_length(uint64_t{1} << 20);
  region->set_remote_key(NonUtf8Bytes("rkey-1"));
  region->set_memory_type(v1::MEMORY_TYPE_HOST);
  v1::KvLayout* layout = pool.mutable_layout();
  layout->set_num_layers(30);
  layout->set_num_kv_heads(3);
  layout->set_head_dim(64);
  layout->set_block_size(16);
  layout->set_dtype(v1::DTYPE_BF16);
  layout->set_block_bytes(12288);  // K and V: 2 * 16 tokens * 3 heads * 64 * 2 bytes.
  layout->set_layer_stride_bytes(uint64_t{12288} * 1024);
  pool.set_pool_epoch(7);
  return pool;
}

// What a snapshot carries of a pool: no regions (remote keys, addresses), no transport address.
v1::KvPoolDescriptor SamplePublicKvPool() {
  const v1::KvPoolDescriptor full = SampleKvPoolDescriptor();
  v1::KvPoolDescriptor pool;
  pool.set_transport(full.transport());
  *pool.mutable_layout() = full.layout();
  pool.set_pool_epoch(full.pool_epoch());
  return pool;
}

v1::Snapshot SampleSnapshot() {
  v1::Snapshot snapshot;
  snapshot.set_worker_id("decode-1");
  snapshot.set_role(v1::ROLE_DECODE);
  snapshot.set_model_id(kModel);
  snapshot.set_block_size(16);
  snapshot.set_total_blocks(1024);
  snapshot.set_free_blocks(900);
  snapshot.set_max_context(8192);
  snapshot.set_max_running(64);
  for (uint64_t hash : {kHashA, kHashB, kHashC}) snapshot.add_cached_block_hashes(hash);
  snapshot.set_last_event_id(41);
  *snapshot.mutable_kv_pool() = SamplePublicKvPool();
  *snapshot.mutable_load() = SampleLoadSample();
  snapshot.set_engine("cpu-avx512");
  snapshot.set_version("0.1.0");
  snapshot.set_max_tokens_per_step(512);
  snapshot.set_max_prefill_tokens(128);
  return snapshot;
}

v1::KvEventBatch SampleKvEventBatch() {
  v1::KvEventBatch batch;
  v1::KvEvent* event = batch.add_events();
  event->set_event_id(42);
  event->mutable_stored()->add_block_hashes(kHashA);  // First blocks: no parent_hash.
  event->mutable_stored()->add_block_hashes(kHashB);
  event = batch.add_events();
  event->set_event_id(43);
  event->mutable_stored()->set_parent_hash(0);  // A parent whose hash is 0: present.
  event->mutable_stored()->add_block_hashes(kHashC);
  event = batch.add_events();
  event->set_event_id(44);
  event->mutable_removed()->add_block_hashes(kHashA);
  event = batch.add_events();
  event->set_event_id(45);
  event->mutable_cleared();
  return batch;
}

v1::DecodeRequest SampleDecodeRequest() {
  v1::DecodeRequest request;
  request.set_request_id(kRequestId);
  request.set_model(kModel);
  for (int32_t id : {1, 15043, 29892}) request.add_prompt_token_ids(id);
  request.add_prior_output_token_ids(450);
  *request.mutable_sampling() = SampleSamplingParams();
  *request.mutable_slo() = SampleSlo();
  request.set_priority(5);
  for (const char* worker : {"prefill-0", "prefill-1"}) {
    v1::PrefillTarget* target = request.add_prefill_targets();
    target->set_worker_id(worker);
    target->set_address(std::string(worker) + ".tandem.svc:50061");
  }
  request.set_prefill_timeout_ms(2000);
  request.set_omit_text(true);
  return request;
}

v1::DecodeResponse SampleDecodeResponse() {
  v1::DecodeResponse response;
  for (int32_t id : {1492, 2}) {
    response.add_token_ids(id);
    *response.add_logprobs() = SampleTokenLogprobs(id);
  }
  *response.add_prompt_logprobs() = SampleTokenLogprobs(15043);
  response.set_text(" end");
  response.set_finish_reason(v1::FINISH_REASON_ERROR);
  *response.mutable_usage() = SampleUsage();
  *response.mutable_timings() = SampleTimings();
  response.set_error_message("out of blocks");
  return response;
}

v1::PrefillRequest SamplePrefillRequest() {
  v1::PrefillRequest request;
  request.set_request_id(kRequestId);
  request.set_model(kModel);
  for (int32_t id = 1; id <= 40; ++id) request.add_token_ids(id * 1000);
  request.set_num_destination_cached_tokens(16);
  v1::KvDestination* destination = request.mutable_destination();
  destination->set_worker_id("decode-1");
  *destination->mutable_pool() = SampleKvPoolDescriptor();
  destination->add_block_ids(17);  // ceil((40 - 16) / 16) = 2 blocks.
  destination->add_block_ids(3);
  *request.mutable_sampling() = SampleSamplingParams();
  request.set_timeout_ms(1500);
  request.set_num_prior_output_tokens(1);
  request.set_priority(2);
  return request;
}

v1::PrefillResponse SamplePrefillResponse() {
  v1::PrefillResponse response;
  response.set_first_token_id(450);
  *response.mutable_first_token_logprobs() = SampleTokenLogprobs(450);
  response.set_num_computed_tokens(8);
  response.set_num_reused_tokens(16);
  v1::PrefillTimings* timings = response.mutable_timings();
  timings->set_queue_us(100);
  timings->set_compute_us(20000);
  timings->set_transfer_us(1500);
  timings->set_transfer_bytes(uint64_t{30} * 2 * 12288);
  return response;
}

std::vector<SampleMessage> AllSampleMessages() {
  std::vector<SampleMessage> samples;
  samples.push_back(Sample("generate_request_prompt", SampleGenerateRequest(v1::GenerateRequest::kPrompt)));
  samples.push_back(Sample("generate_request_chat", SampleGenerateRequest(v1::GenerateRequest::kChat)));
  samples.push_back(Sample("generate_request_token_ids", SampleGenerateRequest(v1::GenerateRequest::kTokenIds)));
  samples.push_back(Sample("generate_response", SampleGenerateResponse()));
  samples.push_back(Sample("tokenize_request_prompt", SampleTokenizeRequest(v1::TokenizeRequest::kPrompt)));
  samples.push_back(Sample("tokenize_request_chat", SampleTokenizeRequest(v1::TokenizeRequest::kChat)));
  samples.push_back(Sample("tokenize_response", SampleTokenizeResponse()));
  samples.push_back(Sample("list_models_request", v1::ListModelsRequest()));
  samples.push_back(Sample("list_models_response", SampleListModelsResponse()));
  samples.push_back(Sample("watch_state_request", SampleWatchStateRequest()));

  v1::WorkerStateUpdate update;
  *update.mutable_snapshot() = SampleSnapshot();
  samples.push_back(Sample("worker_state_snapshot", update));
  *update.mutable_kv_events() = SampleKvEventBatch();
  samples.push_back(Sample("worker_state_kv_events", update));
  *update.mutable_load() = SampleLoadSample();
  samples.push_back(Sample("worker_state_load", update));

  // SamplingParams.response_format, one sample per case (JSON texts with non-ASCII, an empty
  // JsonObject message that must still select its case).
  v1::SamplingParams formatted = SampleSamplingParams();
  formatted.mutable_response_format()->mutable_json_object();
  samples.push_back(Sample("sampling_response_format_json_object", formatted));
  formatted.mutable_response_format()->set_json_schema(
      R"({"type": "object", "properties": {"caf\u00e9": {"type": "string", "enum": ["ü"]}}})");
  samples.push_back(Sample("sampling_response_format_json_schema", formatted));
  formatted.mutable_response_format()->set_regex("[0-9]{3}-\\w+");
  samples.push_back(Sample("sampling_response_format_regex", formatted));
  formatted.mutable_response_format()->set_ebnf("root ::= \"yes\" | \"no\"");
  samples.push_back(Sample("sampling_response_format_ebnf", formatted));
  formatted.mutable_response_format()->set_structural_tag(
      R"({"type": "structural_tag", "format": {"type": "const_string", "value": "\u00e9"}})");
  samples.push_back(Sample("sampling_response_format_structural_tag", formatted));

  samples.push_back(Sample("decode_request", SampleDecodeRequest()));
  samples.push_back(Sample("decode_response", SampleDecodeResponse()));
  v1::DecodeResponse heartbeat;
  heartbeat.set_heartbeat(true);
  samples.push_back(Sample("decode_heartbeat", heartbeat));
  samples.push_back(Sample("prefill_request", SamplePrefillRequest()));
  samples.push_back(Sample("prefill_response", SamplePrefillResponse()));

  v1::CancelRequest cancel;
  cancel.set_request_id(kRequestId);
  cancel.set_reason("client_gone");
  samples.push_back(Sample("cancel_request", cancel));
  v1::CancelResponse cancelled;
  cancelled.set_found(true);
  samples.push_back(Sample("cancel_response", cancelled));
  return samples;
}

std::vector<std::string> InteropSampleLabels() {
  return {"generate_request_chat", "generate_response", "worker_state_snapshot",
          "worker_state_kv_events", "prefill_request"};
}

}  // namespace tandem::proto_testing
