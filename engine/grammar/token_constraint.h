// Grammar-constrained decoding: which tokens may come next so that the output stays a prefix of a
// text the request's response_format accepts (a JSON object, JSON valid against a schema, a regex
// match, an EBNF grammar's sentence).
//
//   ASSIGN_OR_RETURN(auto compiler, ResponseFormatCompiler::Create(
//                                       {.token_bytes = bytes, .stop_token_ids = eos}));
//   ASSIGN_OR_RETURN(CompiledFormat format, compiler->Compile(options.response_format));
//   TokenConstraint constraint(format);
//   for (each decode step) {
//     ASSIGN_OR_RETURN(SampledToken t, sampler.Sample(logits, constraint.AllowedTokens()));
//     RETURN_IF_ERROR(constraint.Accept(t.id));
//     if (constraint.Terminated()) break;   // the output is complete and a stop token was taken
//   }
//
// The stop tokens (the model's EOS / end-of-turn tokens) are allowed exactly when the output so far
// is complete; accepting one terminates the constraint. Control tokens (those whose bytes are
// empty) are never allowed.
//
// Built on xgrammar's C++ core (github.com/mlc-ai/xgrammar, from its PyPI sdist); its types stay
// out of this header. Compiling a format costs milliseconds (a regex) to tens or hundreds of
// milliseconds (a large schema; most of it precomputing the masks of context-independent tokens);
// the compiler keeps compiled formats, so a format seen before compiles at once. A step's mask
// (AllowedTokens) costs microseconds to a few hundred, depending on the grammar state.
#ifndef TANDEM_ENGINE_GRAMMAR_TOKEN_CONSTRAINT_H_
#define TANDEM_ENGINE_GRAMMAR_TOKEN_CONSTRAINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/sampling/sampling_options.h"

namespace tandem::grammar {

// The vocabulary as grammars see it.
struct GrammarVocabulary {
  // One entry per logit (the model's vocab_size, which may exceed the tokenizer's): the bytes the
  // token stands for in output text (a byte-level BPE "Ġ{" as " {", a SentencePiece "▁{" as " {",
  // "<0x0A>" as "\n"). Empty: the token never appears in constrained output (control tokens, ids
  // the tokenizer lacks).
  std::vector<std::string> token_bytes;
  // The tokens that end generation (EOS, end-of-turn), each in [0, token_bytes.size()).
  std::vector<int32_t> stop_token_ids;
  // Threads used to compile one format (xgrammar precomputes token masks in parallel), >= 1.
  int compile_threads = 2;
  // Compiled formats kept for reuse, in bytes (least recently used first out).
  int64_t cache_bytes = int64_t{64} << 20;
};

// A response format compiled against one vocabulary. Cheap to copy (shared, immutable).
class CompiledFormat {
 public:
  struct Impl;
  explicit CompiledFormat(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// Compiles response formats for one vocabulary (one per tokenizer). Thread-safe.
class ResponseFormatCompiler {
 public:
  // INVALID_ARGUMENT for an empty vocabulary or a stop token outside it.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ResponseFormatCompiler>> Create(
      const GrammarVocabulary& vocabulary);
  ~ResponseFormatCompiler();
  ResponseFormatCompiler(const ResponseFormatCompiler&) = delete;
  ResponseFormatCompiler& operator=(const ResponseFormatCompiler&) = delete;

  // Compiles `format` (kJsonObject, kJsonSchema, kRegex, kEbnf or kStructuralTag), or finds it compiled before.
  // INVALID_ARGUMENT with the compiler's message when the schema, regex or grammar is not valid
  // (or uses what it does not support), or for kText.
  //
  // JSON (object and schema) is generated in one layout: one line, ", " and ": " separators (no
  // free whitespace), so that a model cannot pad the output with whitespace forever. Schema `additionalProperties` defaults
  // to false (strict), as OpenAI's structured outputs.
  [[nodiscard]] absl::StatusOr<CompiledFormat> Compile(const sampling::ResponseFormat& format);

  int vocab_size() const { return vocab_size_; }

 private:
  struct Impl;
  ResponseFormatCompiler(std::unique_ptr<Impl> impl, int vocab_size);
  std::unique_ptr<Impl> impl_;
  int vocab_size_ = 0;
};

// One sequence's progress through a compiled format. Thread-compatible; movable.
class TokenConstraint {
 public:
  explicit TokenConstraint(const CompiledFormat& format);
  ~TokenConstraint();
  TokenConstraint(TokenConstraint&&) noexcept;
  TokenConstraint& operator=(TokenConstraint&&) noexcept;

  // The tokens that may come next, as Sampler::Sample takes them: ceil(vocab_size / 32) words,
  // bit t % 32 of word t / 32 set when token t may come next. Empty when every token may (then
  // no mask is needed). Valid until the next call on this object.
  absl::Span<const uint32_t> AllowedTokens();

  // Advances past `token`. INVALID_ARGUMENT (the state unchanged) when the format does not allow
  // it here, or when the constraint has terminated.
  [[nodiscard]] absl::Status Accept(int32_t token);

  // A stop token was accepted at a complete output: nothing may follow.
  bool Terminated() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::grammar

#endif  // TANDEM_ENGINE_GRAMMAR_TOKEN_CONSTRAINT_H_
