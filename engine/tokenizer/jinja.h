// A Jinja template engine for the chat templates models ship (GGUF `tokenizer.chat_template`,
// `chat_template` in tokenizer_config.json).
//
// It renders what Python jinja2 renders with the settings Hugging Face transformers uses for
// chat templates: a sandboxed environment with trim_blocks and lstrip_blocks, the loopcontrols
// extension (break/continue), autoescape off, the final newline of the source dropped
// (keep_trailing_newline off), a `tojson` filter that writes json.dumps(ensure_ascii=False,
// sort_keys=False) and takes `indent`, and the globals `raise_exception(message)` and
// `strftime_now(format)`. transformers' `{% generation %}` block renders its body.
//
// The subset: text, {{ }}, {% %}, {# #} with `-`/`+` whitespace control; if/elif/else,
// for (else, `if` conditions, unpacking, loop.*), set (expression and block form, namespace
// attributes), macro/call, break/continue, raw, filter blocks; expressions with literals, lists,
// dicts, tuples, attribute/item access, slices, tests (`is [not] ...`), `[not] in`, comparisons,
// and/or/not, arithmetic, `~`, inline if; the string, dict and filter functions templates use
// (listed in docs/engine.md). Values print like Python (`None`, `True`, `[1, 'a']`).
// Undefined behaves like jinja2's default Undefined: it prints empty, is falsy and iterates as
// empty; an attribute of it, arithmetic on it or calling it is an error.
//
// Errors are statuses, never crashes: a template that does not parse is INVALID_ARGUMENT with
// "line N: ..."; rendering that fails (an unknown filter or test, a type error, an undefined
// attribute, `raise_exception(...)`) is FAILED_PRECONDITION with the line; a render that passes
// the limits in RenderLimits is RESOURCE_EXHAUSTED.
//
// Thread-safe: a Template is immutable after Parse(); Render() may run concurrently.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem::jinja {

class Value;
using ValueList = std::vector<Value>;

// A dict that keeps insertion order, like Python's. Keys are strings (what chat templates use;
// a non-string key in a literal is an error).
struct ValueDict {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* Find(absl::string_view key) const;
  void Set(std::string key, Value value);  // replaces an existing key in place
};

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A function a template can call (a global, a macro, a bound method).
using NativeFunction = std::function<absl::StatusOr<Value>(const CallArgs&)>;

// A template value: none/undefined, bool, int, float, string, list (or tuple), dict (or a
// namespace(), whose attributes `set` may assign) and callables. Lists, dicts and callables are
// shared, not copied, when a Value is copied.
class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value Undefined(std::string name = "");
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value List(ValueList items, bool tuple = false);
  static Value Dict(ValueDict dict = {}, bool is_namespace = false);
  static Value Function(std::string name, NativeFunction fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_namespace() const { return kind_ == Kind::kDict && namespace_; }

  bool bool_value() const { return b_; }
  int64_t int_value() const { return i_; }
  double float_value() const { return f_; }
  double AsDouble() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : f_; }
  // The string; for undefined, the variable's name (for messages).
  const std::string& string_value() const { return s_; }
  // REQUIRES: is_list() / is_dict() / kind() == kFunction.
  const ValueList& list() const { return *list_; }
  ValueList& mutable_list() { return *list_; }
  const ValueDict& dict() const { return *dict_; }
  ValueDict& mutable_dict() { return *dict_; }
  const NativeFunction& function() const { return *fn_; }

  // Python truthiness (undefined is false).
  bool Truthy() const;
  // str(value) as jinja2 prints it: '' for undefined, 'None', 'True', Python float repr,
  // Python repr of lists and dicts.
  std::string Str() const;
  // repr(value): strings quoted the way Python quotes them.
  std::string Repr() const;
  // A short type name for messages ('str', 'int', 'list', ...).
  const char* TypeName() const;
  // Python ==: 1 == 1.0, lists and dicts element-wise; undefined equals only undefined.
  bool Equals(const Value& other) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  bool namespace_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<NativeFunction> fn_;
};

// json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=False) with json.dumps' default
// separators (", " and ": ", or "," and ": " with an indent). indent < 0: none. Undefined and
// callables cannot be written (INVALID_ARGUMENT).
absl::StatusOr<std::string> ToJson(const Value& value, int indent = -1);

// Limits on one render, so a template cannot run away.
struct RenderLimits {
  int64_t max_output_bytes = 16 << 20;  // text written, including captured blocks
  int64_t max_steps = 10'000'000;       // loop iterations + macro calls + output pieces
  int max_call_depth = 64;              // nested macro calls
};

struct RenderOptions {
  RenderLimits limits;
  // What strftime_now() formats (UTC). Tests fix it; a server passes absl::Now().
  absl::Time now = absl::UnixEpoch();
};

class Template {
 public:
  // Parses `source`. INVALID_ARGUMENT ("line N: ...") when it does not parse, or nests deeper
  // than 256 blocks or expressions.
  static absl::StatusOr<Template> Parse(absl::string_view source);

  // Renders with `context` (a dict of variables: messages, add_generation_prompt, ...) on top
  // of the globals range, namespace, dict, raise_exception and strftime_now.
  // REQUIRES: context.is_dict().
  absl::StatusOr<std::string> Render(const Value& context, const RenderOptions& options) const;

  struct Program;  // the parsed template (jinja_ast.h)

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace tandem::jinja

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_H_
