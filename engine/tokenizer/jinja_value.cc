// Values of the Jinja engine: construction, Python-like printing, equality and JSON.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/tokenizer/jinja.h"

namespace tandem::jinja {

const Value* ValueDict::Find(absl::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::Set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::Undefined(std::string name) {
  Value v;
  v.s_ = std::move(name);
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}
Value Value::List(ValueList items, bool tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::Dict(ValueDict dict, bool is_namespace) {
  Value v;
  v.kind_ = Kind::kDict;
  v.namespace_ = is_namespace;
  v.dict_ = std::make_shared<ValueDict>(std::move(dict));
  return v;
}
Value Value::Function(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<NativeFunction>(std::move(fn));
  return v;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return namespace_ || !dict_->entries.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

namespace {

// Python's repr() of a float: the shortest digits that round-trip, positional for exponents in
// [-4, 16), scientific (e+XX) otherwise, and ".0" on integral values.
std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  if (ec != std::errc()) return "nan";
  std::string sci(buf, end);  // [-]d[.ddd]e[+-]XX
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  const int exp = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  const int n = static_cast<int>(digits.size());
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(-exp - 1, '0') + digits;
    } else if (exp + 1 >= n) {
      out = digits + std::string(exp + 1 - n, '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  }
  if (out.empty()) {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += ebuf;
  }
  return sign + out;
}

std::string StringRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(i_);
    case Kind::kFloat:
      return FloatRepr(f_);
    case Kind::kString:
      return StringRepr(s_);
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*list_)[i].Repr();
      }
      if (tuple_ && list_->size() == 1) out += ",";
      out += tuple_ ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      if (namespace_) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : dict_->entries) {
        if (!first) out += ", ";
        first = false;
        absl::StrAppend(&out, StringRepr(k), ": ", v.Repr());
      }
      return out + "}";
    }
    case Kind::kFunction:
      return absl::StrCat("<function ", s_, ">");
  }
  return "";
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return namespace_ ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

bool Value::Equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (kind_ == Kind::kInt && other.kind_ == Kind::kInt) return i_ == other.i_;
    return AsDouble() == other.AsDouble();
  }
  // bool is an int in Python: True == 1.
  if ((kind_ == Kind::kBool && other.is_number()) || (is_number() && other.kind_ == Kind::kBool)) {
    const double a = kind_ == Kind::kBool ? (b_ ? 1 : 0) : AsDouble();
    const double b = other.kind_ == Kind::kBool ? (other.b_ ? 1 : 0) : other.AsDouble();
    return a == b;
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return b_ == other.b_;
    case Kind::kString:
      return s_ == other.s_;
    case Kind::kList:
      if (tuple_ != other.tuple_ || list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*other.list_)[i])) return false;
      }
      return true;
    case Kind::kDict:
      if (namespace_ || other.namespace_) return dict_ == other.dict_;
      if (dict_->entries.size() != other.dict_->entries.size()) return false;
      for (const auto& [k, v] : dict_->entries) {
        const Value* o = other.dict_->Find(k);
        if (o == nullptr || !v.Equals(*o)) return false;
      }
      return true;
    case Kind::kFunction:
      return fn_ == other.fn_;
    default:
      return false;
  }
}

namespace {

void JsonString(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

absl::Status Json(const Value& v, int indent, int depth, std::string* out) {
  if (depth > 256) return absl::InvalidArgumentError("tojson: the value nests too deeply");
  const auto newline = [&](int d) {
    if (indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(indent) * d, ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.bool_value() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.int_value());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double f = v.float_value();
      if (std::isnan(f)) {
        *out += "NaN";
      } else if (std::isinf(f)) {
        *out += f > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += v.Repr();
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      JsonString(v.string_value(), out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      *out += '[';
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        RETURN_IF_ERROR(Json(v.list()[i], indent, depth + 1, out));
      }
      newline(depth);
      *out += ']';
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.is_namespace()) break;
      if (v.dict().entries.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      *out += '{';
      bool first = true;
      for (const auto& [k, item] : v.dict().entries) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        JsonString(k, out);
        *out += ": ";
        RETURN_IF_ERROR(Json(item, indent, depth + 1, out));
      }
      newline(depth);
      *out += '}';
      return absl::OkStatus();
    }
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tojson: Object of type ", v.TypeName(), " is not JSON serializable"));
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& value, int indent) {
  std::string out;
  absl::Status status = Json(value, indent, 0, &out);
  if (!status.ok()) return status;
  return out;
}

}  // namespace tandem::jinja
