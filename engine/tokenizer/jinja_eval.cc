// The evaluator of the Jinja engine: renders a Template::Program with a context.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "engine/tokenizer/jinja_ast.h"
#include "engine/tokenizer/unicode.h"

namespace tandem::jinja {
namespace {

absl::Status RenderError(int line, absl::string_view message) {
  return absl::FailedPreconditionError(absl::StrCat("line ", line, ": ", message));
}

// Python's str.isspace() per code point.
bool IsPythonSpace(char32_t cp) {
  return (cp >= 0x1C && cp <= 0x1F) ||
         (cp != kInvalidCodepoint && (CodepointClass(cp) & kUnicodeWhitespace));
}

std::vector<char32_t> Codepoints(absl::string_view s) {
  std::vector<char32_t> out;
  for (size_t pos = 0; pos < s.size();) {
    char32_t cp;
    pos += DecodeUtf8(s, pos, &cp);
    out.push_back(cp);
  }
  return out;
}

std::string FromCodepoints(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) AppendUtf8(cps[i], &out);
  return out;
}

// str.strip/lstrip/rstrip: whitespace, or any code point of `chars` when given.
std::string Strip(absl::string_view s, const Value* chars, bool left, bool right) {
  const std::vector<char32_t> cps = Codepoints(s);
  std::vector<char32_t> set;
  const bool by_set = chars != nullptr && chars->is_string();
  if (by_set) set = Codepoints(chars->string_value());
  const auto strip = [&](char32_t cp) {
    return by_set ? std::find(set.begin(), set.end(), cp) != set.end() : IsPythonSpace(cp);
  };
  size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return FromCodepoints(cps, begin, end);
}

std::string AsciiMap(absl::string_view s, bool upper) {
  std::string out(s);
  for (char& c : out) c = upper ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
  return out;
}

// str.title(): the first letter of each run of letters upper, the rest lower (ASCII).
std::string Title(absl::string_view s) {
  std::string out(s);
  bool prev_letter = false;
  for (char& c : out) {
    const bool letter = absl::ascii_isalpha(c);
    c = letter ? (prev_letter ? absl::ascii_tolower(c) : absl::ascii_toupper(c)) : c;
    prev_letter = letter;
  }
  return out;
}

// Python slice indices over `n` items.
std::vector<size_t> SliceIndices(int64_t n, const Value& start, const Value& stop,
                                 const Value& step_v) {
  const int64_t step = step_v.kind() == Value::Kind::kInt ? step_v.int_value() : 1;
  std::vector<size_t> out;
  if (step == 0) return out;
  const auto clamp = [&](const Value& v, int64_t fallback, int64_t lo, int64_t hi) {
    if (v.kind() != Value::Kind::kInt) return fallback;
    int64_t i = v.int_value();
    if (i < 0) i += n;
    return std::clamp(i, lo, hi);
  };
  if (step > 0) {
    const int64_t b = clamp(start, 0, 0, n), e = clamp(stop, n, 0, n);
    for (int64_t i = b; i < e; i += step) out.push_back(static_cast<size_t>(i));
  } else {
    const int64_t b = clamp(start, n - 1, -1, n - 1), e = clamp(stop, -1, -1, n - 1);
    for (int64_t i = b; i > e; i += step) out.push_back(static_cast<size_t>(i));
  }
  return out;
}

const Value* Kwarg(const CallArgs& args, absl::string_view name) {
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

// Argument `index` by position, or by `name`; nullptr when absent.
const Value* Arg(const CallArgs& args, size_t index, absl::string_view name) {
  if (index < args.positional.size()) return &args.positional[index];
  return Kwarg(args, name);
}

class Renderer {
 public:
  Renderer(const RenderOptions& options, const Value& context) : options_(options) {
    auto globals = std::make_shared<ValueDict>();
    AddGlobals(globals.get());
    for (const auto& [k, v] : context.dict().entries) globals->Set(k, v);
    frames_.push_back(std::move(globals));
  }

  // A macro holds the frames it was defined in and a frame may hold the macro (a macro that
  // calls itself, any macro defined at the top), and a namespace may hold itself: reference
  // cycles. The render's values cannot outlive it (the output is a string, the context is read
  // only), so every frame a macro captured and every namespace the render made (namespace()) is
  // emptied here, which frees them and what they hold. A namespace the caller passed in the
  // context is left as it is.
  ~Renderer() {
    for (const std::shared_ptr<ValueDict>& frame : cyclic_frames_) Empty(*frame);
    for (Value& ns : cyclic_namespaces_) Empty(ns.mutable_dict());
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  absl::StatusOr<std::string> Run(const Body& body) {
    std::string out;
    RETURN_IF_ERROR(RenderBody(body, &out));
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // ---- Statements -----------------------------------------------------------------------------

  absl::Status Write(std::string_view text, std::string* out, int line) {
    if (static_cast<int64_t>(out->size() + text.size()) > options_.limits.max_output_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "line ", line, ": the template's output passes ", options_.limits.max_output_bytes,
          " bytes"));
    }
    out->append(text);
    return Step(line);
  }

  // A string or list this big may not be built: values are bounded like the output, so a
  // template cannot exhaust memory by doubling a string or a list (strings are copied into
  // lists; nested lists and dicts are shared, so a list costs its own items' bytes).
  absl::Status Fits(int64_t bytes, int line) const {
    if (bytes > options_.limits.max_output_bytes) {
      // line 0 (a method call): the call adds its line.
      return absl::ResourceExhaustedError(absl::StrCat(
          line > 0 ? absl::StrCat("line ", line, ": ") : "", "a value would take more than ",
          options_.limits.max_output_bytes, " bytes"));
    }
    return absl::OkStatus();
  }
  static int64_t ListBytes(const ValueList& items) {
    int64_t bytes = 0;
    for (const Value& v : items) {
      bytes += static_cast<int64_t>(sizeof(Value)) +
               (v.is_string() ? static_cast<int64_t>(v.string_value().size()) : 0);
    }
    return bytes;
  }

  absl::Status Step(int line) {
    if (++steps_ > options_.limits.max_steps) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "line ", line, ": the template ran more than ", options_.limits.max_steps, " steps"));
    }
    return absl::OkStatus();
  }

  absl::Status RenderBody(const Body& body, std::string* out) {
    for (const NodePtr& node : body) {
      RETURN_IF_ERROR(RenderNode(*node, out));
      if (flow_ != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  void SetVar(const std::string& name, Value v) { frames_.back()->Set(name, std::move(v)); }

  absl::Status Assign(const Node& node, const std::vector<std::string>& targets, Value v) {
    if (targets.size() == 1) {
      SetVar(targets[0], std::move(v));
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(ValueList items, Iterate(v, node.line));
    if (items.size() != targets.size()) {
      return RenderError(node.line, absl::StrCat("cannot unpack ", items.size(), " values into ",
                                                 targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) SetVar(targets[i], std::move(items[i]));
    return absl::OkStatus();
  }

  absl::Status RenderNode(const Node& node, std::string* out) {
    switch (node.type) {
      case Node::Type::kText:
        return Write(node.text, out, node.line);
      case Node::Type::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
        return Write(v.Str(), out, node.line);
      }
      case Node::Type::kIf:
        for (const auto& [cond, body] : node.branches) {
          bool take = cond == nullptr;
          if (!take) {
            ASSIGN_OR_RETURN(Value c, Eval(*cond));
            take = c.Truthy();
          }
          if (take) return RenderBody(body, out);
        }
        return absl::OkStatus();
      case Node::Type::kFor:
        return RenderFor(node, out);
      case Node::Type::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
        if (!node.target_object.empty()) {
          Value ns = Lookup(node.target_object);
          if (!ns.is_namespace()) {
            return RenderError(node.line, absl::StrCat("cannot assign attribute on non-namespace "
                                                       "object '", node.target_object, "'"));
          }
          ns.mutable_dict().Set(node.targets[0], std::move(v));
          return absl::OkStatus();
        }
        return Assign(node, node.targets, std::move(v));
      }
      case Node::Type::kSetBlock: {
        std::string captured;
        RETURN_IF_ERROR(RenderBody(node.body, &captured));
        Value v = Value::String(std::move(captured));
        if (node.expr != nullptr) {
          frames_.push_back(std::make_shared<ValueDict>());
          SetVar("__body__", v);
          absl::StatusOr<Value> filtered = Eval(*node.expr);
          frames_.pop_back();
          if (!filtered.ok()) return filtered.status();
          v = *std::move(filtered);
        }
        SetVar(node.targets[0], std::move(v));
        return absl::OkStatus();
      }
      case Node::Type::kMacro:
        SetVar(node.text, MakeMacro(node, node.text));
        return absl::OkStatus();
      case Node::Type::kCallBlock: {
        ASSIGN_OR_RETURN(Value fn, Eval(*node.expr->children[0]));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(*node.expr));
        args.keyword.emplace_back("caller", MakeMacro(node, "caller"));
        if (fn.kind() != Value::Kind::kFunction) {
          return RenderError(node.line, "'call' needs a macro");
        }
        ASSIGN_OR_RETURN(Value v, fn.function()(args));
        return Write(v.Str(), out, node.line);
      }
      case Node::Type::kFilterBlock: {
        std::string captured;
        RETURN_IF_ERROR(RenderBody(node.body, &captured));
        frames_.push_back(std::make_shared<ValueDict>());
        SetVar("__body__", Value::String(std::move(captured)));
        absl::StatusOr<Value> v = Eval(*node.expr);
        frames_.pop_back();
        if (!v.ok()) return v.status();
        return Write(v->Str(), out, node.line);
      }
      case Node::Type::kBreak:
        flow_ = Flow::kBreak;
        return absl::OkStatus();
      case Node::Type::kContinue:
        flow_ = Flow::kContinue;
        return absl::OkStatus();
      case Node::Type::kScope:
        return RenderBody(node.body, out);
    }
    return absl::OkStatus();
  }

  absl::Status RenderFor(const Node& node, std::string* out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr));
    ASSIGN_OR_RETURN(ValueList all, Iterate(iterable, node.line));
    frames_.push_back(std::make_shared<ValueDict>());
    absl::Status status = RenderForItems(node, std::move(all), out);
    frames_.pop_back();
    flow_ = Flow::kNormal;
    return status;
  }

  absl::Status RenderForItems(const Node& node, ValueList all, std::string* out) {
    ValueList items;
    if (node.condition != nullptr) {
      for (Value& item : all) {
        RETURN_IF_ERROR(Step(node.line));
        RETURN_IF_ERROR(Assign(node, node.targets, item));
        ASSIGN_OR_RETURN(Value keep, Eval(*node.condition));
        if (keep.Truthy()) items.push_back(std::move(item));
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) return RenderBody(node.else_body, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      RETURN_IF_ERROR(Step(node.line));
      ValueDict loop;
      loop.Set("index", Value::Int(i + 1));
      loop.Set("index0", Value::Int(i));
      loop.Set("revindex", Value::Int(n - i));
      loop.Set("revindex0", Value::Int(n - i - 1));
      loop.Set("first", Value::Bool(i == 0));
      loop.Set("last", Value::Bool(i == n - 1));
      loop.Set("length", Value::Int(n));
      loop.Set("depth", Value::Int(1));
      loop.Set("depth0", Value::Int(0));
      loop.Set("previtem", i > 0 ? items[i - 1] : Value::Undefined("previtem"));
      loop.Set("nextitem", i + 1 < n ? items[i + 1] : Value::Undefined("nextitem"));
      loop.Set("cycle", Value::Function("cycle", [i](const CallArgs& args) -> absl::StatusOr<Value> {
                 if (args.positional.empty()) {
                   return absl::FailedPreconditionError("no items for cycling given");
                 }
                 return args.positional[i % args.positional.size()];
               }));
      SetVar("loop", Value::Dict(std::move(loop)));
      RETURN_IF_ERROR(Assign(node, node.targets, items[i]));
      RETURN_IF_ERROR(RenderBody(node.body, out));
      if (flow_ == Flow::kBreak) break;
      flow_ = Flow::kNormal;
    }
    return absl::OkStatus();
  }

  // A macro (or a call block's `caller`) as a function value. It sees the globals and the
  // variables of the frame it was defined in, as they are when it is called.
  Value MakeMacro(const Node& node, const std::string& name) {
    std::vector<std::shared_ptr<ValueDict>> defining = frames_;
    for (const std::shared_ptr<ValueDict>& frame : defining) MayBeCyclic(frame);
    return Value::Function(name, [this, &node, name, defining](const CallArgs& args)
                                     -> absl::StatusOr<Value> {
      if (++call_depth_ > options_.limits.max_call_depth) {
        --call_depth_;
        return absl::ResourceExhaustedError(absl::StrCat(
            "line ", node.line, ": macro calls nest deeper than ",
            options_.limits.max_call_depth));
      }
      std::vector<std::shared_ptr<ValueDict>> saved = std::move(frames_);
      frames_ = defining;
      frames_.push_back(std::make_shared<ValueDict>());
      absl::Status status = BindMacroArgs(node, name, args);
      std::string out;
      if (status.ok()) status = RenderBody(node.body, &out);
      flow_ = Flow::kNormal;
      frames_ = std::move(saved);
      --call_depth_;
      if (!status.ok()) return status;
      return Value::String(std::move(out));
    });
  }

  absl::Status BindMacroArgs(const Node& node, const std::string& name, const CallArgs& args) {
    RETURN_IF_ERROR(Step(node.line));
    if (args.positional.size() > node.params.size()) {
      return RenderError(node.line, absl::StrCat("macro '", name, "' takes not more than ",
                                                 node.params.size(), " argument(s)"));
    }
    for (size_t i = 0; i < node.params.size(); ++i) {
      const auto& [param, fallback] = node.params[i];
      if (i < args.positional.size()) {
        SetVar(param, args.positional[i]);
      } else if (const Value* kw = Kwarg(args, param)) {
        SetVar(param, *kw);
      } else if (fallback != nullptr) {
        ASSIGN_OR_RETURN(Value v, Eval(*fallback));
        SetVar(param, std::move(v));
      } else {
        SetVar(param, Value::Undefined(param));
      }
    }
    for (const auto& [k, v] : args.keyword) {
      if (k == "caller") {
        SetVar(k, v);
        continue;
      }
      bool known = false;
      for (const auto& p : node.params) known = known || p.first == k;
      if (!known) {
        return RenderError(node.line,
                           absl::StrCat("macro '", name, "' takes no keyword argument '", k, "'"));
      }
    }
    return absl::OkStatus();
  }

  // ---- Expressions ----------------------------------------------------------------------------

  Value Lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      if (const Value* v = (*it)->Find(name)) return *v;
    }
    return Value::Undefined(name);
  }

  absl::StatusOr<ValueList> Iterate(const Value& v, int line) const {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return ValueList{};
      case Value::Kind::kList:
        return v.list();
      case Value::Kind::kDict: {
        if (v.is_namespace()) break;
        ValueList keys;
        for (const auto& [k, item] : v.dict().entries) keys.push_back(Value::String(k));
        return keys;
      }
      case Value::Kind::kString: {
        ValueList chars;
        for (char32_t cp : Codepoints(v.string_value())) {
          std::string s;
          AppendUtf8(cp, &s);
          chars.push_back(Value::String(std::move(s)));
        }
        return chars;
      }
      default:
        break;
    }
    return RenderError(line, absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.type) {
      case Expr::Type::kLiteral:
        return e.literal;
      case Expr::Type::kName:
        return Lookup(e.name);
      case Expr::Type::kList:
      case Expr::Type::kTuple: {
        ValueList items;
        for (const ExprPtr& c : e.children) {
          ASSIGN_OR_RETURN(Value v, Eval(*c));
          items.push_back(std::move(v));
        }
        return Value::List(std::move(items), e.type == Expr::Type::kTuple);
      }
      case Expr::Type::kDict: {
        ValueDict dict;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.children[i]));
          ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1]));
          if (!k.is_string()) {
            return RenderError(e.line, "dict keys other than strings are not supported");
          }
          dict.Set(k.string_value(), std::move(v));
        }
        return Value::Dict(std::move(dict));
      }
      case Expr::Type::kGetAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        return GetAttr(obj, e.name, e.line);
      }
      case Expr::Type::kGetItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*e.children[1]));
        return GetItem(obj, key, e.line);
      }
      case Expr::Type::kSlice:
        return EvalSlice(e);
      case Expr::Type::kCall: {
        ASSIGN_OR_RETURN(Value fn, Eval(*e.children[0]));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e));
        if (fn.kind() != Value::Kind::kFunction) {
          if (fn.is_undefined()) {
            return RenderError(e.line, absl::StrCat("'", fn.string_value(), "' is undefined"));
          }
          return RenderError(e.line, absl::StrCat("'", fn.TypeName(), "' object is not callable"));
        }
        absl::StatusOr<Value> result = fn.function()(args);
        if (!result.ok() && !absl::StartsWith(result.status().message(), "line ")) {
          return absl::Status(result.status().code(),
                              absl::StrCat("line ", e.line, ": ", result.status().message()));
        }
        return result;
      }
      case Expr::Type::kFilter: {
        ASSIGN_OR_RETURN(Value operand, Eval(*e.children[0]));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e));
        return ApplyFilter(e.name, operand, args, e.line);
      }
      case Expr::Type::kTest: {
        ASSIGN_OR_RETURN(Value operand, Eval(*e.children[0]));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e));
        ASSIGN_OR_RETURN(bool result, ApplyTest(e.name, operand, args, e.line));
        return Value::Bool(result != e.negated);
      }
      case Expr::Type::kUnary: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.children[0]));
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (v.kind() == Value::Kind::kInt) return Value::Int(e.name == "-" ? -v.int_value() : v.int_value());
        if (v.kind() == Value::Kind::kFloat) {
          return Value::Float(e.name == "-" ? -v.float_value() : v.float_value());
        }
        if (v.kind() == Value::Kind::kBool) return Value::Int(e.name == "-" ? -int{v.bool_value()} : v.bool_value());
        return RenderError(e.line, absl::StrCat("bad operand type for unary ", e.name, ": '",
                                                v.TypeName(), "'"));
      }
      case Expr::Type::kBinary:
        return EvalBinary(e);
      case Expr::Type::kCompare: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.children[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          ASSIGN_OR_RETURN(Value right, Eval(*e.children[i + 1]));
          ASSIGN_OR_RETURN(bool ok, Compare(e.ops[i], left, right, e.line));
          if (!ok) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Type::kCondition: {
        ASSIGN_OR_RETURN(Value cond, Eval(*e.children[1]));
        if (cond.Truthy()) return Eval(*e.children[0]);
        if (e.children[2] == nullptr) return Value::Undefined("");
        return Eval(*e.children[2]);
      }
    }
    return RenderError(e.line, "unknown expression");
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e) {
    CallArgs args;
    const size_t first = 1;  // children[0] is the callee or the operand
    for (size_t i = first; i < e.children.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.children[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [k, c] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*c));
      args.keyword.emplace_back(k, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
    Value bounds[3];
    for (int i = 0; i < 3; ++i) {
      if (e.children[i + 1] == nullptr) continue;
      ASSIGN_OR_RETURN(bounds[i], Eval(*e.children[i + 1]));
      if (!bounds[i].is_none() && bounds[i].kind() != Value::Kind::kInt) {
        return RenderError(e.line, "slice indices must be integers or None");
      }
    }
    if (bounds[2].kind() == Value::Kind::kInt && bounds[2].int_value() == 0) {
      return RenderError(e.line, "slice step cannot be zero");
    }
    if (obj.is_list()) {
      ValueList out;
      for (size_t i : SliceIndices(static_cast<int64_t>(obj.list().size()), bounds[0], bounds[1],
                                   bounds[2])) {
        out.push_back(obj.list()[i]);
      }
      return Value::List(std::move(out), obj.is_tuple());
    }
    if (obj.is_string()) {
      const std::vector<char32_t> cps = Codepoints(obj.string_value());
      std::string out;
      for (size_t i : SliceIndices(static_cast<int64_t>(cps.size()), bounds[0], bounds[1],
                                   bounds[2])) {
        AppendUtf8(cps[i], &out);
      }
      return Value::String(std::move(out));
    }
    if (obj.is_undefined()) return UndefinedError(obj, e.line);
    return RenderError(e.line, absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }

  static absl::Status UndefinedError(const Value& v, int line) {
    return RenderError(line, absl::StrCat("'", v.string_value(), "' is undefined"));
  }

  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) return UndefinedError(obj, line);
    if (obj.is_dict() && !obj.is_namespace() && key.is_string()) {
      if (const Value* v = obj.dict().Find(key.string_value())) return *v;
    }
    if (key.kind() == Value::Kind::kInt && (obj.is_list() || obj.is_string())) {
      if (obj.is_list()) {
        int64_t i = key.int_value();
        const int64_t n = static_cast<int64_t>(obj.list().size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.list()[i];
      } else {
        const std::vector<char32_t> cps = Codepoints(obj.string_value());
        int64_t i = key.int_value();
        const int64_t n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::String(FromCodepoints(cps, i, i + 1));
      }
      return Value::Undefined(absl::StrCat(obj.TypeName(), " object has no element ", key.Repr()));
    }
    if (key.is_string()) return GetAttr(obj, key.string_value(), line);
    return Value::Undefined(absl::StrCat(obj.TypeName(), " object has no element ", key.Repr()));
  }

  absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name, int line) {
    if (obj.is_undefined()) return UndefinedError(obj, line);
    if (obj.is_namespace()) {
      if (const Value* v = obj.dict().Find(name)) return *v;
      return Value::Undefined(absl::StrCat("Namespace object has no attribute '", name, "'"));
    }
    if (std::optional<Value> method = BoundMethod(obj, name)) return *method;
    if (obj.is_dict()) {
      if (const Value* v = obj.dict().Find(name)) return *v;
      return Value::Undefined(absl::StrCat("dict object has no attribute '", name, "'"));
    }
    return Value::Undefined(absl::StrCat(obj.TypeName(), " object has no attribute '", name, "'"));
  }

  // The methods of str, dict and list that templates call (list's are read-only: jinja2's
  // immutable sandbox refuses append, pop, ...).
  std::optional<Value> BoundMethod(const Value& obj, const std::string& name) {
    static constexpr absl::string_view kStringMethods[] = {
        "strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower",
        "title", "capitalize", "replace", "find", "count", "join", "format", "isdigit",
        "isalpha", "isspace", "islower", "isupper", "splitlines"};
    static constexpr absl::string_view kDictMethods[] = {"items", "keys", "values", "get"};
    bool known = false;
    if (obj.is_string()) {
      for (absl::string_view m : kStringMethods) known = known || m == name;
    } else if (obj.is_dict()) {
      for (absl::string_view m : kDictMethods) known = known || m == name;
    } else if (obj.is_list()) {
      known = name == "index" || name == "count";
    }
    if (!known) return std::nullopt;
    return Value::Function(name, [this, obj, name](const CallArgs& args) {
      return CallMethod(obj, name, args);
    });
  }

  absl::StatusOr<Value> CallMethod(const Value& obj, const std::string& name,
                                   const CallArgs& args) {
    const Value* a0 = Arg(args, 0, "");
    const Value* a1 = Arg(args, 1, "");
    if (obj.is_dict()) {
      if (name == "items") {
        ValueList out;
        for (const auto& [k, v] : obj.dict().entries) {
          out.push_back(Value::List({Value::String(k), v}, /*tuple=*/true));
        }
        return Value::List(std::move(out));
      }
      if (name == "keys" || name == "values") {
        ValueList out;
        for (const auto& [k, v] : obj.dict().entries) {
          out.push_back(name == "keys" ? Value::String(k) : v);
        }
        return Value::List(std::move(out));
      }
      // get
      if (a0 != nullptr && a0->is_string()) {
        if (const Value* v = obj.dict().Find(a0->string_value())) return *v;
      }
      return a1 != nullptr ? *a1 : Value::None();
    }
    if (obj.is_list()) {
      int64_t count = 0;
      for (size_t i = 0; i < obj.list().size(); ++i) {
        if (a0 != nullptr && obj.list()[i].Equals(*a0)) {
          if (name == "index") return Value::Int(static_cast<int64_t>(i));
          ++count;
        }
      }
      if (name == "index") return absl::FailedPreconditionError("list.index(x): x not in list");
      return Value::Int(count);
    }
    const std::string& s = obj.string_value();
    const auto need_string = [&](const Value* v) -> absl::Status {
      if (v == nullptr || !v->is_string()) {
        return absl::FailedPreconditionError(absl::StrCat("str.", name, "() needs a string argument"));
      }
      return absl::OkStatus();
    };
    if (name == "strip") return Value::String(Strip(s, a0, true, true));
    if (name == "lstrip") return Value::String(Strip(s, a0, true, false));
    if (name == "rstrip") return Value::String(Strip(s, a0, false, true));
    if (name == "upper" || name == "lower") return Value::String(AsciiMap(s, name == "upper"));
    if (name == "title") return Value::String(Title(s));
    if (name == "capitalize") {
      std::string out = AsciiMap(s, false);
      if (!out.empty()) out[0] = absl::ascii_toupper(out[0]);
      return Value::String(out);
    }
    if (name == "startswith" || name == "endswith") {
      if (a0 == nullptr) return need_string(a0);
      ValueList options = a0->is_list() ? a0->list() : ValueList{*a0};
      for (const Value& o : options) {
        RETURN_IF_ERROR(need_string(&o));
        if (name == "startswith" ? absl::StartsWith(s, o.string_value())
                                 : absl::EndsWith(s, o.string_value())) {
          return Value::Bool(true);
        }
      }
      return Value::Bool(false);
    }
    if (name == "split") return Split(s, a0, a1);
    if (name == "splitlines") {
      ValueList out;
      for (absl::string_view line : absl::StrSplit(s, '\n')) out.push_back(Value::String(std::string(line)));
      if (!out.empty() && out.back().string_value().empty()) out.pop_back();
      return Value::List(std::move(out));
    }
    if (name == "replace") {
      RETURN_IF_ERROR(need_string(a0));
      RETURN_IF_ERROR(need_string(a1));
      const Value* count = Arg(args, 2, "count");
      return ReplaceValue(s, a0->string_value(), a1->string_value(),
                          count != nullptr && count->kind() == Value::Kind::kInt
                              ? count->int_value()
                              : -1,
                          0);
    }
    if (name == "find" || name == "count") {
      RETURN_IF_ERROR(need_string(a0));
      if (name == "find") {
        const size_t at = s.find(a0->string_value());
        if (at == std::string::npos) return Value::Int(-1);
        return Value::Int(static_cast<int64_t>(Codepoints(s.substr(0, at)).size()));
      }
      if (a0->string_value().empty()) return Value::Int(Codepoints(s).size() + 1);
      int64_t count = 0;
      for (size_t at = s.find(a0->string_value()); at != std::string::npos;
           at = s.find(a0->string_value(), at + a0->string_value().size())) {
        ++count;
      }
      return Value::Int(count);
    }
    if (name == "join") {
      if (a0 == nullptr) return need_string(a0);
      ASSIGN_OR_RETURN(ValueList items, Iterate(*a0, 0));
      std::vector<std::string> parts;
      int64_t bytes = 0;
      for (const Value& v : items) {
        RETURN_IF_ERROR(need_string(&v));
        bytes += static_cast<int64_t>(v.string_value().size() + s.size());
        RETURN_IF_ERROR(Fits(bytes, 0));
        parts.push_back(v.string_value());
      }
      return Value::String(absl::StrJoin(parts, s));
    }
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "islower" ||
        name == "isupper") {
      if (s.empty()) return Value::Bool(false);
      bool all = true, cased = false;
      for (char c : s) {
        if (name == "isdigit") all = all && absl::ascii_isdigit(c);
        if (name == "isalpha") all = all && absl::ascii_isalpha(c);
        if (name == "isspace") all = all && absl::ascii_isspace(c);
        if (name == "islower") {
          all = all && !absl::ascii_isupper(c);
          cased = cased || absl::ascii_islower(c);
        }
        if (name == "isupper") {
          all = all && !absl::ascii_islower(c);
          cased = cased || absl::ascii_isupper(c);
        }
      }
      if (name == "islower" || name == "isupper") all = all && cased;
      return Value::Bool(all);
    }
    return absl::FailedPreconditionError(absl::StrCat("str.", name, "() is not supported"));
  }

  // str.replace; RESOURCE_EXHAUSTED when the result would pass the output limit.
  absl::StatusOr<Value> ReplaceValue(const std::string& s, const std::string& from,
                                     const std::string& to, int64_t count, int line) const {
    // The result's size before building it: s plus (to - from) per replacement.
    int64_t n = 0;
    if (from.empty()) {
      n = static_cast<int64_t>(Codepoints(s).size()) + 1;
    } else {
      for (size_t at = s.find(from); at != std::string::npos && (count < 0 || n < count);
           at = s.find(from, at + from.size())) {
        ++n;
      }
    }
    if (count >= 0) n = std::min(n, count);
    RETURN_IF_ERROR(Fits(static_cast<int64_t>(s.size()) +
                             n * (static_cast<int64_t>(to.size()) -
                                  static_cast<int64_t>(from.size())),
                         line));
    return Value::String(Replace(s, from, to, count));
  }

  static std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                             int64_t count) {
    if (from.empty()) {
      // Python inserts `to` between every code point (and at both ends).
      std::string out;
      const std::vector<char32_t> cps = Codepoints(s);
      int64_t done = 0;
      for (size_t i = 0; i <= cps.size(); ++i) {
        if (count < 0 || done < count) {
          out += to;
          ++done;
        }
        if (i < cps.size()) AppendUtf8(cps[i], &out);
      }
      return out;
    }
    std::string out;
    size_t pos = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
      const size_t at = s.find(from, pos);
      if (at == std::string::npos) break;
      out.append(s, pos, at - pos);
      out += to;
      pos = at + from.size();
      ++done;
    }
    out.append(s, pos, std::string::npos);
    return out;
  }

  absl::StatusOr<Value> Split(const std::string& s, const Value* sep, const Value* max_v) {
    const int64_t max_split =
        max_v != nullptr && max_v->kind() == Value::Kind::kInt ? max_v->int_value() : -1;
    ValueList out;
    if (sep == nullptr || sep->is_none()) {
      // Runs of whitespace; no empty strings.
      const std::vector<char32_t> cps = Codepoints(s);
      size_t i = 0;
      int64_t splits = 0;
      while (i < cps.size()) {
        while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
        if (i >= cps.size()) break;
        if (max_split >= 0 && splits >= max_split) {
          size_t end = cps.size();
          while (end > i && IsPythonSpace(cps[end - 1])) --end;
          out.push_back(Value::String(FromCodepoints(cps, i, end)));
          break;
        }
        size_t j = i;
        while (j < cps.size() && !IsPythonSpace(cps[j])) ++j;
        out.push_back(Value::String(FromCodepoints(cps, i, j)));
        ++splits;
        i = j;
      }
      return Value::List(std::move(out));
    }
    if (!sep->is_string() || sep->string_value().empty()) {
      return absl::FailedPreconditionError("str.split(): empty or non-string separator");
    }
    const std::string& d = sep->string_value();
    size_t pos = 0;
    int64_t splits = 0;
    while (max_split < 0 || splits < max_split) {
      const size_t at = s.find(d, pos);
      if (at == std::string::npos) break;
      out.push_back(Value::String(s.substr(pos, at - pos)));
      pos = at + d.size();
      ++splits;
    }
    out.push_back(Value::String(s.substr(pos)));
    return Value::List(std::move(out));
  }

  absl::StatusOr<Value> EvalBinary(const Expr& e) {
    ASSIGN_OR_RETURN(Value a, Eval(*e.children[0]));
    if (e.name == "and") {
      if (!a.Truthy()) return a;
      return Eval(*e.children[1]);
    }
    if (e.name == "or") {
      if (a.Truthy()) return a;
      return Eval(*e.children[1]);
    }
    ASSIGN_OR_RETURN(Value b, Eval(*e.children[1]));
    const std::string& op = e.name;
    if (op == "~") {
      std::string s = a.Str();
      const std::string t = b.Str();
      RETURN_IF_ERROR(Fits(static_cast<int64_t>(s.size() + t.size()), e.line));
      s += t;
      return Value::String(std::move(s));
    }
    const auto as_number = [](const Value& v) -> Value {
      return v.kind() == Value::Kind::kBool ? Value::Int(v.bool_value()) : v;
    };
    const Value x = as_number(a), y = as_number(b);
    if (x.is_number() && y.is_number()) {
      const bool ints = x.kind() == Value::Kind::kInt && y.kind() == Value::Kind::kInt;
      const double fx = x.AsDouble(), fy = y.AsDouble();
      if (op == "+" || op == "-" || op == "*") {
        if (ints) {
          int64_t r;
          const bool overflow =
              op == "+"   ? __builtin_add_overflow(x.int_value(), y.int_value(), &r)
              : op == "-" ? __builtin_sub_overflow(x.int_value(), y.int_value(), &r)
                          : __builtin_mul_overflow(x.int_value(), y.int_value(), &r);
          if (overflow) return RenderError(e.line, "integer overflow");
          return Value::Int(r);
        }
        return Value::Float(op == "+" ? fx + fy : op == "-" ? fx - fy : fx * fy);
      }
      if (op == "/") {
        if (fy == 0) return RenderError(e.line, "division by zero");
        return Value::Float(fx / fy);
      }
      if (op == "//" || op == "%") {
        if (fy == 0) return RenderError(e.line, "integer division or modulo by zero");
        if (ints) {
          const int64_t p = x.int_value(), q = y.int_value();
          int64_t d = p / q, m = p % q;
          if (m != 0 && ((m < 0) != (q < 0))) {
            --d;
            m += q;
          }
          return Value::Int(op == "//" ? d : m);
        }
        const double d = std::floor(fx / fy);
        return Value::Float(op == "//" ? d : fx - d * fy);
      }
      if (op == "**") {
        if (ints && y.int_value() >= 0) {
          int64_t r = 1;
          for (int64_t i = 0; i < y.int_value(); ++i) {
            if (__builtin_mul_overflow(r, x.int_value(), &r)) {
              return RenderError(e.line, "integer overflow");
            }
          }
          return Value::Int(r);
        }
        return Value::Float(std::pow(fx, fy));
      }
    }
    if (op == "+" && a.is_string() && b.is_string()) {
      RETURN_IF_ERROR(
          Fits(static_cast<int64_t>(a.string_value().size() + b.string_value().size()), e.line));
      return Value::String(a.string_value() + b.string_value());
    }
    if (op == "+" && a.is_list() && b.is_list()) {
      RETURN_IF_ERROR(Fits(ListBytes(a.list()) + ListBytes(b.list()), e.line));
      ValueList out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(out), a.is_tuple() && b.is_tuple());
    }
    if (op == "*" && (b.is_string() || b.is_list()) && x.kind() == Value::Kind::kInt) {
      return RepeatSequence(b, x.int_value(), e.line);
    }
    if (op == "*" && (a.is_string() || a.is_list()) && y.kind() == Value::Kind::kInt) {
      return RepeatSequence(a, y.int_value(), e.line);
    }
    if (a.is_undefined()) return UndefinedError(a, e.line);
    if (b.is_undefined()) return UndefinedError(b, e.line);
    return RenderError(e.line, absl::StrCat("unsupported operand type(s) for ", op, ": '",
                                            a.TypeName(), "' and '", b.TypeName(), "'"));
  }

  absl::StatusOr<Value> RepeatSequence(const Value& a, int64_t count, int line) {
    {
      const int64_t n = std::max<int64_t>(0, count);
      const int64_t size = a.is_string() ? a.string_value().size() : ListBytes(a.list());
      if (n > options_.limits.max_output_bytes ||
          n * std::max<int64_t>(size, 1) > options_.limits.max_output_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat("line ", line, ": repetition too large"));
      }
      if (a.is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += a.string_value();
        return Value::String(std::move(out));
      }
      ValueList out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), a.list().begin(), a.list().end());
      return Value::List(std::move(out));
    }
  }

  absl::StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return a.Equals(b);
    if (op == "!=") return !a.Equals(b);
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string()) {
        if (!a.is_string()) {
          return RenderError(line, absl::StrCat("'in <string>' requires string as left operand, "
                                                "not ", a.TypeName()));
        }
        found = absl::StrContains(b.string_value(), a.string_value());
      } else if (b.is_dict() && !b.is_namespace()) {
        found = a.is_string() && b.dict().Find(a.string_value()) != nullptr;
      } else if (b.is_list()) {
        for (const Value& v : b.list()) found = found || v.Equals(a);
      } else if (!b.is_undefined()) {
        return RenderError(line, absl::StrCat("argument of type '", b.TypeName(),
                                              "' is not iterable"));
      }
      return op == "in" ? found : !found;
    }
    ASSIGN_OR_RETURN(int c, Order(a, b, line));
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  // Python ordering: numbers with numbers, strings with strings, lists element-wise.
  absl::StatusOr<int> Order(const Value& a, const Value& b, int line) {
    const auto num = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::kBool; };
    if (num(a) && num(b)) {
      const double x = a.kind() == Value::Kind::kBool ? a.bool_value() : a.AsDouble();
      const double y = b.kind() == Value::Kind::kBool ? b.bool_value() : b.AsDouble();
      if (a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt) {
        return a.int_value() < b.int_value() ? -1 : a.int_value() > b.int_value() ? 1 : 0;
      }
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) {
      const int c = a.string_value().compare(b.string_value());
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    if (a.is_list() && b.is_list()) {
      for (size_t i = 0; i < a.list().size() && i < b.list().size(); ++i) {
        if (a.list()[i].Equals(b.list()[i])) continue;
        return Order(a.list()[i], b.list()[i], line);
      }
      return a.list().size() < b.list().size() ? -1 : a.list().size() > b.list().size() ? 1 : 0;
    }
    if (a.is_undefined()) return UndefinedError(a, line);
    if (b.is_undefined()) return UndefinedError(b, line);
    return RenderError(line, absl::StrCat("'<' not supported between instances of '",
                                          a.TypeName(), "' and '", b.TypeName(), "'"));
  }

  // ---- Filters and tests (jinja_filters.cc) ---------------------------------------------------
 public:
  absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const CallArgs& args,
                                    int line);
  absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const CallArgs& args,
                                 int line);
  absl::StatusOr<Value> Attribute(const Value& v, const std::string& path, int line);
  absl::StatusOr<ValueList> Items(const Value& v, int line) const { return Iterate(v, line); }
  absl::StatusOr<int> OrderOf(const Value& a, const Value& b, int line) { return Order(a, b, line); }
  std::optional<Value> Method(const Value& obj, const std::string& name) {
    return BoundMethod(obj, name);
  }

 private:
  void AddGlobals(ValueDict* globals);

  // Remembers a frame or namespace to empty at the end of the render (see ~Renderer).
  void MayBeCyclic(const std::shared_ptr<ValueDict>& frame) {
    if (cyclic_seen_.insert(frame.get()).second) cyclic_frames_.push_back(frame);
  }
  void MayBeCyclic(const Value& ns) {
    if (cyclic_seen_.insert(&ns.dict()).second) cyclic_namespaces_.push_back(ns);
  }
  // The entries are moved out before they are destroyed, so nothing they release finds the dict
  // half-cleared.
  static void Empty(ValueDict& dict) {
    std::vector<std::pair<std::string, Value>> entries = std::move(dict.entries);
    dict.entries.clear();
  }

  const RenderOptions& options_;
  std::vector<std::shared_ptr<ValueDict>> frames_;
  // Held until the end of the render, so an address in cyclic_seen_ is never reused.
  std::vector<std::shared_ptr<ValueDict>> cyclic_frames_;
  std::vector<Value> cyclic_namespaces_;
  absl::flat_hash_set<const ValueDict*> cyclic_seen_;
  Flow flow_ = Flow::kNormal;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace
}  // namespace tandem::jinja

#include "engine/tokenizer/jinja_filters.inc"

namespace tandem::jinja {

absl::StatusOr<Template> Template::Parse(absl::string_view source) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Program> program, ParseProgram(source));
  return Template(std::move(program));
}

absl::StatusOr<std::string> Template::Render(const Value& context,
                                             const RenderOptions& options) const {
  if (!context.is_dict()) return absl::InvalidArgumentError("the context must be a dict");
  Renderer renderer(options, context);
  return renderer.Run(program_->body);
}

}  // namespace tandem::jinja
