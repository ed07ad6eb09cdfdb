#include "engine/grammar/token_constraint.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

#include "absl/strings/str_cat.h"

namespace tandem::grammar {
namespace {

using sampling::ResponseFormat;

// Compiled JSON has no free whitespace (xgrammar then writes ", " and ": " between items, as
// Python's json.dumps does by default): a model cannot stall in whitespace.
constexpr bool kAnyWhitespace = false;

// xgrammar reports bad input by exception; each becomes a Status here, never leaves this file.
template <typename F>
auto Guard(absl::string_view what, F&& f) -> absl::StatusOr<decltype(f())> {
  try {
    return f();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", e.what()));
  }
}

}  // namespace

struct CompiledFormat::Impl {
  xgrammar::CompiledGrammar grammar;
};

struct ResponseFormatCompiler::Impl {
  xgrammar::GrammarCompiler compiler;
};

ResponseFormatCompiler::ResponseFormatCompiler(std::unique_ptr<Impl> impl, int vocab_size)
    : impl_(std::move(impl)), vocab_size_(vocab_size) {}

ResponseFormatCompiler::~ResponseFormatCompiler() = default;

absl::StatusOr<std::unique_ptr<ResponseFormatCompiler>> ResponseFormatCompiler::Create(
    const GrammarVocabulary& v) {
  const auto n = static_cast<int>(v.token_bytes.size());
  if (n == 0) return absl::InvalidArgumentError("the grammar vocabulary is empty");
  for (int32_t id : v.stop_token_ids) {
    if (id < 0 || id >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token ", id, " is outside the vocabulary of ", n, " tokens"));
    }
  }
  if (v.compile_threads < 1) {
    return absl::InvalidArgumentError("compile_threads must be at least 1");
  }
  absl::StatusOr<std::unique_ptr<Impl>> impl = Guard("grammar vocabulary", [&] {
    // RAW: token_bytes are the output bytes themselves (our tokenizer decoded the BPE or
    // SentencePiece spelling), so xgrammar needs to know nothing of either scheme.
    xgrammar::TokenizerInfo info(v.token_bytes, xgrammar::VocabType::RAW, n, v.stop_token_ids,
                                 /*add_prefix_space=*/false);
    return std::make_unique<Impl>(Impl{xgrammar::GrammarCompiler(
        info, v.compile_threads, /*cache_enabled=*/true, v.cache_bytes)});
  });
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<ResponseFormatCompiler>(new ResponseFormatCompiler(*std::move(impl), n));
}

absl::StatusOr<CompiledFormat> ResponseFormatCompiler::Compile(const ResponseFormat& format) {
  xgrammar::GrammarCompiler& c = impl_->compiler;
  absl::StatusOr<xgrammar::CompiledGrammar> compiled = absl::InvalidArgumentError(
      "response_format: a text format needs no grammar");
  switch (format.kind) {
    case ResponseFormat::Kind::kText:
      break;
    case ResponseFormat::Kind::kJsonObject:
      // Any object; not strict, so that any property may appear.
      compiled = Guard("response_format json_object", [&] {
        return c.CompileJSONSchema(R"({"type": "object"})", kAnyWhitespace, std::nullopt,
                                   std::nullopt, /*strict_mode=*/false);
      });
      break;
    case ResponseFormat::Kind::kJsonSchema:
      compiled = Guard("response_format json_schema", [&] {
        return c.CompileJSONSchema(format.text, kAnyWhitespace, std::nullopt, std::nullopt,
                                   /*strict_mode=*/true);
      });
      break;
    case ResponseFormat::Kind::kRegex:
      compiled = Guard("response_format regex", [&] { return c.CompileRegex(format.text); });
      break;
    case ResponseFormat::Kind::kEbnf:
      compiled = Guard("response_format grammar", [&] { return c.CompileGrammar(format.text); });
      break;
    case ResponseFormat::Kind::kStructuralTag:
      compiled = Guard("tool call structural tag",
                       [&] { return c.CompileStructuralTag(format.text); });
      break;
  }
  if (!compiled.ok()) return compiled.status();
  return CompiledFormat(std::make_shared<const CompiledFormat::Impl>(
      CompiledFormat::Impl{*std::move(compiled)}));
}

struct TokenConstraint::Impl {
  xgrammar::GrammarMatcher matcher;
  int vocab_size;
  std::vector<int32_t> mask;  // [ceil(vocab_size / 32)], xgrammar's layout: bit t % 32 of t / 32
  int64_t shape[1];
  DLTensor tensor;
};

TokenConstraint::TokenConstraint(const CompiledFormat& format) {
  const xgrammar::CompiledGrammar& g = format.impl().grammar;
  const int vocab_size = g.GetTokenizerInfo().GetVocabSize();
  // No rollback: a sequence only moves forward (a migrated one replays its tokens from the start).
  impl_ = std::unique_ptr<Impl>(new Impl{xgrammar::GrammarMatcher(g, std::nullopt, false, -1),
                                         vocab_size, {}, {}, {}});
  impl_->mask.assign(static_cast<size_t>(xgrammar::GetBitmaskSize(vocab_size)), 0);
  impl_->shape[0] = static_cast<int64_t>(impl_->mask.size());
  DLTensor& t = impl_->tensor;
  t.data = impl_->mask.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = impl_->shape;
  t.strides = nullptr;
  t.byte_offset = 0;
}

TokenConstraint::~TokenConstraint() = default;
TokenConstraint::TokenConstraint(TokenConstraint&&) noexcept = default;
TokenConstraint& TokenConstraint::operator=(TokenConstraint&&) noexcept = default;

absl::Span<const uint32_t> TokenConstraint::AllowedTokens() {
  // The DLTensor points into impl_ (heap), so a moved TokenConstraint keeps it valid.
  const bool restricted = impl_->matcher.FillNextTokenBitmask(&impl_->tensor);
  if (!restricted) return {};
  return absl::MakeConstSpan(reinterpret_cast<const uint32_t*>(impl_->mask.data()),
                             impl_->mask.size());
}

absl::Status TokenConstraint::Accept(int32_t token) {
  if (token < 0 || token >= impl_->vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("token ", token, " is outside the vocabulary"));
  }
  if (impl_->matcher.IsTerminated()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " follows the end of the response_format's output"));
  }
  if (!impl_->matcher.AcceptToken(token)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " cannot continue an output of the response_format"));
  }
  return absl::OkStatus();
}

bool TokenConstraint::Terminated() const { return impl_->matcher.IsTerminated(); }

}  // namespace tandem::grammar
