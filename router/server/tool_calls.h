// Function calling (docs/api.md, "Function calling"): a chat request's tools checked, the grammar
// that forces a call (tool_choice "required" or a named function), the text form of calls and
// tool definitions for models whose chat template takes no tools, and the model's output parsed
// back into calls. Pure functions and one parser class, no I/O.
//
// The call formats (ToolCallFormat), one per model, chosen from its chat template:
//   kHermes      <tool_call>\n{"name": "<function>", "arguments": {<JSON object>}}\n</tool_call>
//                anywhere in the output, each block one call (Hermes / Qwen2.5 / Qwen3, and
//                Tandem's fallback for templates that take no tools).
//   kLlama3Json  {"name": "<function>", "parameters": {<JSON object>}} as the whole output,
//                optionally after <|python_tag|>, several separated by ";" (Llama 3.1 / 3.2 /
//                3.3).
//   kMistral     [TOOL_CALLS] [{"name": "<function>", "arguments": {...}}, ...] anywhere in the
//                output, each block a list of calls (Mistral 7B v0.3 / Nemo / Small); call ids
//                of 9 letters and digits.
#ifndef TANDEM_ROUTER_SERVER_TOOL_CALLS_H_
#define TANDEM_ROUTER_SERVER_TOOL_CALLS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/v1/inference.pb.h"

namespace tandem::router {

inline constexpr absl::string_view kToolCallBegin = "<tool_call>";
inline constexpr absl::string_view kToolCallEnd = "</tool_call>";
inline constexpr absl::string_view kLlamaPythonTag = "<|python_tag|>";
inline constexpr absl::string_view kMistralToolCalls = "[TOOL_CALLS]";
// The most tools one request may carry.
inline constexpr int kMaxTools = 128;

// How a model writes its calls (the file comment).
enum class ToolCallFormat { kHermes, kLlama3Json, kMistral };

// The format of calls a Jinja chat template that mentions `tools` writes, by the first rule that
// holds: it mentions "<tool_call>": kHermes; "[TOOL_CALLS]" but not "[ARGS]" (the newer
// "[TOOL_CALLS]name[ARGS]{...}" form is not parsed): kMistral; "<|start_header_id|>" and
// "\"parameters\"": kLlama3Json; otherwise nullopt (a form Tandem does not parse).
std::optional<ToolCallFormat> ToolCallFormatOfTemplate(absl::string_view jinja);

// "hermes", "llama3_json" or "mistral" (logs, docs).
absl::string_view ToolCallFormatName(ToolCallFormat format);

// The request's tool_choice with its default resolved: AUTO when it has tools, NONE without.
v1::ToolChoice::Mode EffectiveToolChoice(const v1::GenerateRequest& request);

// Whether the request's output is parsed for calls: tools, and tool_choice other than NONE.
bool ParsesToolCalls(const v1::GenerateRequest& request);

// Checks the function-calling parts of a request as it came from a client: tools only with a
// chat, names valid and unique, parameters a JSON object, tool_choice consistent with the tools,
// parallel_tool_calls only with tools, the messages' tool_calls (id, name, arguments a JSON
// object) and tool messages' tool_call_id. INVALID_ARGUMENT whose param (common/
// status_conversion.h) is the OpenAI field ("tools[0].function.name", "tool_choice",
// "messages[2].tool_calls[0].function.arguments", ...).
absl::Status ValidateTools(const v1::GenerateRequest& request);

// Whether the request's calls are enforced by a grammar (ToolCallStructuralTag): tool_choice
// REQUIRED or FUNCTION, or AUTO with a tool marked strict.
bool ConstrainsToolCalls(const v1::GenerateRequest& request);

// xgrammar's structural tag of a request that ConstrainsToolCalls. REQUIRED or FUNCTION: the
// output is one call (parallel_tool_calls false) or several of the allowed functions, in
// `format`, with arguments valid against each function's parameters; nothing else. Several are
// separated by "\n" (kHermes), "; " (kLlama3Json) or ", " inside one [TOOL_CALLS] list
// (kMistral). AUTO: free text, in which the format's start of a call ("<tool_call>",
// "{\"name\": ", "[TOOL_CALLS]") must go on as a call of one of the tools (kMistral: a list of
// one call); with parallel_tool_calls false the output ends after the first call.
// REQUIRES: ValidateTools(request) is OK and ConstrainsToolCalls(request).
std::string ToolCallStructuralTag(const v1::GenerateRequest& request,
                                  ToolCallFormat format = ToolCallFormat::kHermes);

// The tools as OpenAI's list, [{"type": "function", "function": {"name", "description",
// "parameters"}}] (description and parameters only where given), JSON text; what a chat template
// gets as `tools`.
std::string ToolsJson(const google::protobuf::RepeatedPtrField<v1::Tool>& tools);

// For a chat template that takes no tools: the system message text that lists the tools and asks
// for calls in the text form above.
std::string FallbackToolsPrompt(const google::protobuf::RepeatedPtrField<v1::Tool>& tools);

// One call in the text form above ("<tool_call>\n{...}\n</tool_call>"); `arguments` is JSON text
// (written as it is when it is not an object).
std::string ToolCallText(absl::string_view name, absl::string_view arguments);

// A fresh call id: "call_" and 24 random letters and digits; kMistral: 9 random letters and
// digits (Mistral's templates refuse any other).
std::string NewToolCallId(ToolCallFormat format = ToolCallFormat::kHermes);

// A call found in the output.
struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object's text, the model's key order kept
  bool operator==(const ParsedToolCall&) const = default;
};

// Splits a model's output, fed in pieces as it streams, into content and calls. A call is a JSON
// object {"name": one of `names`, "arguments": object (or "parameters", Llama's spelling; or the
// text of an object; absent: {})}, written in `format`:
//   kHermes      a complete <tool_call> block whose body is one call;
//   kLlama3Json  at the start of the output (after whitespace, and <|python_tag|> if written) a
//                call; after a call, ";" and another call. The JSON object ends where its braces
//                close. Anything else (text first, a bad object, text after a call) is content
//                from there on;
//   kMistral     "[TOOL_CALLS]", whitespace, then a JSON list of calls (or one call) whose
//                brackets close: the calls, all or none.
// Any other block (bad JSON, an unknown function, unterminated at the end) stays content as it
// was written. Whitespace between content and a call is dropped (the content before a call is
// right-trimmed, after a call left-trimmed), so feeding the output whole or in any pieces gives
// the same pieces concatenated. Text that may still turn out to start a call (a prefix of the
// format's marker, or whitespace; kLlama3Json: a call being written at the start) is held back
// until it cannot or until Finish. Not thread-safe.
class ToolCallParser {
 public:
  explicit ToolCallParser(absl::flat_hash_set<std::string> names,
                          ToolCallFormat format = ToolCallFormat::kHermes)
      : names_(std::move(names)), format_(format) {}

  // One piece of output: content text, or a call.
  struct Piece {
    std::string content;
    std::optional<ParsedToolCall> call;
  };
  // The pieces `text` completes, in order (content pieces are non-empty).
  std::vector<Piece> Feed(absl::string_view text);
  // The end of the output: what was held back, as content.
  std::vector<Piece> Finish();

  // Calls parsed so far.
  int calls() const { return calls_; }

 private:
  void EmitContent(absl::string_view text, std::vector<Piece>* out);
  // kHermes and kMistral: a marker opens a block anywhere.
  void FeedMarked(std::vector<Piece>* out);
  // kLlama3Json: calls at the start only.
  void FeedLlama(std::vector<Piece>* out);
  // Where the open block ends in pending_: its body is pending_[0, *body_end) and it takes
  // pending_[0, *block_end). False while it may still go on.
  bool FindBlockEnd(size_t* body_end, size_t* block_end) const;
  // A block's body as its calls (at least one), or nullopt.
  std::optional<std::vector<ParsedToolCall>> ParseBlock(absl::string_view body) const;
  absl::string_view marker() const;

  const absl::flat_hash_set<std::string> names_;
  const ToolCallFormat format_;
  std::string pending_;         // not yet emitted
  bool in_call_ = false;        // pending_ follows a marker (not in pending_)
  std::string ws_before_call_;  // whitespace dropped before the open call's marker
  bool after_call_ = false;     // whitespace right after a call is dropped
  // kLlama3Json: before any call, right after one, or content from here on.
  enum class LlamaPhase { kStart, kAfterCall, kContent };
  LlamaPhase llama_phase_ = LlamaPhase::kStart;
  int calls_ = 0;
};

// The whole output at once: its content (nullopt when it is empty with calls) and calls.
struct ParsedOutput {
  std::optional<std::string> content;
  std::vector<ParsedToolCall> calls;
};
ParsedOutput ParseToolCalls(absl::string_view text, const absl::flat_hash_set<std::string>& names,
                            ToolCallFormat format = ToolCallFormat::kHermes);

// The names of the request's tools.
absl::flat_hash_set<std::string> ToolNames(const v1::GenerateRequest& request);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_TOOL_CALLS_H_
