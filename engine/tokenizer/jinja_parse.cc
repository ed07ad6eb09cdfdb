// Lexer and parser of the Jinja engine: source text -> Template::Program.
//
// Whitespace follows jinja2 with trim_blocks and lstrip_blocks: the newline after a block or
// comment tag is dropped, spaces and tabs before one on its line are dropped (not with `{%+`),
// `-` strips all whitespace on its side, and one trailing newline of the source is dropped.
#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/tokenizer/jinja_ast.h"

namespace tandem::jinja {
namespace {

constexpr int kMaxDepth = 256;

struct Token {
  enum class Type { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt,
                    kFloat, kOp, kEof };
  Type type;
  std::string text;
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0;
};

absl::Status SyntaxError(int line, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", message));
}

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// \r\n and \r become \n, as jinja2's lexer does for text and string literals.
std::string NormalizeNewlines(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(absl::string_view source) : src_(source) {}

  absl::StatusOr<std::vector<Token>> Run() {
    // keep_trailing_newline=False: one final newline goes.
    if (!src_.empty() && src_.back() == '\n') {
      src_.remove_suffix(1);
      if (!src_.empty() && src_.back() == '\r') src_.remove_suffix(1);
    } else if (!src_.empty() && src_.back() == '\r') {
      src_.remove_suffix(1);
    }
    bool strip_next = false;  // the previous tag ended with `-`
    bool trim_next = false;   // the previous tag was a block or comment (trim_blocks)
    while (pos_ < src_.size()) {
      size_t open = FindTagStart(pos_);
      std::string text(src_.substr(pos_, open - pos_));
      const int text_line = line_;
      CountLines(pos_, open);
      pos_ = open;
      if (strip_next) {
        size_t i = 0;
        while (i < text.size() && absl::ascii_isspace(text[i])) ++i;
        text.erase(0, i);
      } else if (trim_next && !text.empty()) {
        if (text[0] == '\n') {
          text.erase(0, 1);
        } else if (text.size() >= 2 && text[0] == '\r' && text[1] == '\n') {
          text.erase(0, 2);
        } else if (text[0] == '\r') {
          text.erase(0, 1);
        }
      }
      strip_next = trim_next = false;
      if (open >= src_.size()) {
        Emit(Token::Type::kText, NormalizeNewlines(text), text_line);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char modifier = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (modifier == '-') {
        while (!text.empty() && absl::ascii_isspace(text.back())) text.pop_back();
      } else if (modifier != '+' && kind != '{') {
        // lstrip_blocks: only spaces/tabs between the line start and the tag.
        size_t i = text.size();
        while (i > 0 && (text[i - 1] == ' ' || text[i - 1] == '\t')) --i;
        const bool line_start = i == 0 ? (text_line == 1 && open == text.size()) ||
                                             AtLineStart(open - text.size())
                                       : text[i - 1] == '\n' || text[i - 1] == '\r';
        if (line_start) text.erase(i);
      }
      Emit(Token::Type::kText, NormalizeNewlines(text), text_line);
      pos_ = open + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t close = src_.find("#}", pos_);
        if (close == absl::string_view::npos) return SyntaxError(line_, "unclosed comment");
        strip_next = close > pos_ && src_[close - 1] == '-';
        trim_next = !strip_next && !(close > pos_ && src_[close - 1] == '+');
        CountLines(pos_, close + 2);
        pos_ = close + 2;
        continue;
      }
      if (kind == '%' && IsRawStart()) {
        RETURN_IF_ERROR(LexRaw(&strip_next, &trim_next));
        continue;
      }
      Emit(kind == '{' ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "", line_);
      RETURN_IF_ERROR(LexTag(kind == '{' ? '}' : '%', &strip_next, &trim_next));
    }
    Emit(Token::Type::kEof, "", line_);
    return std::move(tokens_);
  }

 private:
  // Whether `at` starts a line (only used when the text before a tag is empty).
  bool AtLineStart(size_t at) const {
    return at == 0 || src_[at - 1] == '\n' || src_[at - 1] == '\r';
  }

  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) {
      if (src_[i] == '\n') ++line_;
    }
  }

  void Emit(Token::Type type, std::string text, int line) {
    if (type == Token::Type::kText && text.empty()) return;
    tokens_.push_back(Token{.type = type, .text = std::move(text), .line = line});
  }

  size_t SkipSpace(size_t i) const {
    while (i < src_.size() && absl::ascii_isspace(src_[i])) ++i;
    return i;
  }

  bool IsRawStart() const {
    const size_t i = SkipSpace(pos_);
    return src_.substr(i, 3) == "raw" && (i + 3 >= src_.size() || !IsNameChar(src_[i + 3]));
  }

  // After `{% raw`: the text up to `{% endraw %}` verbatim.
  absl::Status LexRaw(bool* strip_next, bool* trim_next) {
    size_t i = SkipSpace(pos_) + 3;
    i = SkipSpace(i);
    bool strip_body_start = false;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) {
      strip_body_start = src_[i] == '-';
      ++i;
    }
    if (src_.substr(i, 2) != "%}") return SyntaxError(line_, "expected '%}' after 'raw'");
    size_t body = i + 2;
    // trim_blocks applies to the raw tag too.
    if (!strip_body_start && body < src_.size() && src_[body] == '\n') ++body;
    for (size_t j = body; j + 1 < src_.size(); ++j) {
      if (src_[j] != '{' || src_[j + 1] != '%') continue;
      size_t k = j + 2;
      const char modifier = k < src_.size() ? src_[k] : '\0';
      if (modifier == '-' || modifier == '+') ++k;
      k = SkipSpace(k);
      if (src_.substr(k, 6) != "endraw") continue;
      k = SkipSpace(k + 6);
      bool strip_after = false;
      if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) {
        strip_after = src_[k] == '-';
        ++k;
      }
      if (src_.substr(k, 2) != "%}") continue;
      std::string text(src_.substr(body, j - body));
      if (strip_body_start) {
        size_t s = 0;
        while (s < text.size() && absl::ascii_isspace(text[s])) ++s;
        text.erase(0, s);
      }
      if (modifier == '-') {
        while (!text.empty() && absl::ascii_isspace(text.back())) text.pop_back();
      } else if (modifier != '+') {
        size_t e = text.size();
        while (e > 0 && (text[e - 1] == ' ' || text[e - 1] == '\t')) --e;
        if (e == 0 || text[e - 1] == '\n') text.erase(e);
      }
      Emit(Token::Type::kText, NormalizeNewlines(text), line_);
      CountLines(pos_, k + 2);
      pos_ = k + 2;
      *strip_next = strip_after;
      *trim_next = !strip_after;
      return absl::OkStatus();
    }
    return SyntaxError(line_, "missing {% endraw %}");
  }

  // Lexes the inside of a tag up to its end ('}' for `}}`, '%' for `%}`).
  absl::Status LexTag(char end, bool* strip_next, bool* trim_next) {
    int depth = 0;
    const Token::Type end_type = end == '}' ? Token::Type::kVarEnd : Token::Type::kBlockEnd;
    while (true) {
      while (pos_ < src_.size() && absl::ascii_isspace(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        return SyntaxError(line_, end == '}' ? "unexpected end of template, expected '}}'"
                                             : "unexpected end of template, expected '%}'");
      }
      const absl::string_view rest = src_.substr(pos_);
      if (depth == 0) {
        const std::string close = std::string(1, end) + "}";
        for (const char m : {'-', '+'}) {
          if (rest.size() >= 3 && rest[0] == m && rest.substr(1, 2) == close) {
            Emit(end_type, "", line_);
            pos_ += 3;
            *strip_next = m == '-';
            *trim_next = false;
            return absl::OkStatus();
          }
        }
        if (rest.substr(0, 2) == close) {
          Emit(end_type, "", line_);
          pos_ += 2;
          *trim_next = end == '%';
          return absl::OkStatus();
        }
      }
      const char c = rest[0];
      if (IsNameStart(c)) {
        size_t n = 1;
        while (n < rest.size() && IsNameChar(rest[n])) ++n;
        Emit(Token::Type::kName, std::string(rest.substr(0, n)), line_);
        pos_ += n;
      } else if (absl::ascii_isdigit(c)) {
        RETURN_IF_ERROR(LexNumber(rest));
      } else if (c == '\'' || c == '"') {
        RETURN_IF_ERROR(LexString(rest));
      } else {
        static constexpr absl::string_view kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+",
                                                     "-",  "*",  "/",  "%",  "~",  "<",  ">",
                                                     "=",  ".",  ",",  ":",  "|",  "(",  ")",
                                                     "[",  "]",  "{",  "}"};
        absl::string_view op;
        for (absl::string_view candidate : kOps) {
          if (rest.substr(0, candidate.size()) == candidate) {
            op = candidate;
            break;
          }
        }
        if (op.empty()) return SyntaxError(line_, absl::StrCat("unexpected char '", rest.substr(0, 1), "'"));
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) return SyntaxError(line_, absl::StrCat("unexpected '", op, "'"));
          --depth;
        }
        Emit(Token::Type::kOp, std::string(op), line_);
        pos_ += op.size();
      }
    }
  }

  absl::Status LexNumber(absl::string_view rest) {
    size_t n = 0;
    bool is_float = false;
    std::string digits;
    while (n < rest.size() && (absl::ascii_isdigit(rest[n]) || rest[n] == '_')) {
      if (rest[n] != '_') digits += rest[n];
      ++n;
    }
    if (n + 1 < rest.size() && rest[n] == '.' && absl::ascii_isdigit(rest[n + 1])) {
      is_float = true;
      digits += rest[n++];
      while (n < rest.size() && (absl::ascii_isdigit(rest[n]) || rest[n] == '_')) {
        if (rest[n] != '_') digits += rest[n];
        ++n;
      }
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && absl::ascii_isdigit(rest[m])) {
        is_float = true;
        digits += std::string(rest.substr(n, m - n));
        n = m;
        while (n < rest.size() && absl::ascii_isdigit(rest[n])) digits += rest[n++];
      }
    }
    Token t{.type = is_float ? Token::Type::kFloat : Token::Type::kInt,
            .text = digits, .line = line_};
    if (is_float) {
      t.float_value = std::strtod(digits.c_str(), nullptr);
    } else {
      if (digits.size() > 18) return SyntaxError(line_, "integer literal too large");
      t.int_value = std::strtoll(digits.c_str(), nullptr, 10);
    }
    tokens_.push_back(std::move(t));
    pos_ += n;
    return absl::OkStatus();
  }

  // A string literal with Python's escapes (jinja2 decodes them with "unicode-escape").
  absl::Status LexString(absl::string_view rest) {
    const char quote = rest[0];
    std::string value;
    size_t i = 1;
    const int start_line = line_;
    while (true) {
      if (i >= rest.size()) return SyntaxError(start_line, "unterminated string");
      const char c = rest[i];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\' || i + 1 >= rest.size()) {
        value += c;
        ++i;
        continue;
      }
      const char e = rest[i + 1];
      i += 2;
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '\n': ++line_; break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + len > rest.size()) return SyntaxError(line_, "truncated \\x/\\u escape");
          uint32_t cp = 0;
          for (size_t k = 0; k < len; ++k) {
            const char h = rest[i + k];
            if (!absl::ascii_isxdigit(h)) return SyntaxError(line_, "bad \\x/\\u escape");
            cp = cp * 16 + (absl::ascii_isdigit(h) ? h - '0' : absl::ascii_tolower(h) - 'a' + 10);
          }
          if (cp > 0x10FFFF) return SyntaxError(line_, "escape outside Unicode");
          AppendUtf8(cp, &value);
          i += len;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = e - '0';
            for (int k = 0; k < 2 && i < rest.size() && rest[i] >= '0' && rest[i] <= '7'; ++k) {
              cp = cp * 8 + (rest[i++] - '0');
            }
            AppendUtf8(cp, &value);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    tokens_.push_back(Token{.type = Token::Type::kString, .text = NormalizeNewlines(value),
                            .line = start_line});
    pos_ += i + 1;
    return absl::OkStatus();
  }

  absl::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseTemplate() {
    Body body;
    std::string end;
    RETURN_IF_ERROR(ParseBody({}, &body, &end));
    return body;
  }

 private:
  using T = Token::Type;

  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& Next() {
    const Token& t = Peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool IsOp(absl::string_view op, size_t ahead = 0) const {
    return Peek(ahead).type == T::kOp && Peek(ahead).text == op;
  }
  bool IsName(absl::string_view name, size_t ahead = 0) const {
    return Peek(ahead).type == T::kName && Peek(ahead).text == name;
  }
  bool AcceptOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool AcceptName(absl::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case T::kEof: return "end of template";
      case T::kBlockEnd: return "'%}'";
      case T::kVarEnd: return "'}}'";
      case T::kText: return "template text";
      default: return absl::StrCat("'", t.text, "'");
    }
  }
  absl::Status Unexpected(absl::string_view expected) {
    return SyntaxError(Peek().line,
                       absl::StrCat("expected ", expected, ", got ", Describe(Peek())));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!AcceptOp(op)) return Unexpected(absl::StrCat("'", op, "'"));
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Peek().type != T::kBlockEnd) return Unexpected("'%}'");
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().type != T::kName) return Unexpected("a name");
    return Next().text;
  }

  // Parses nodes until a block tag whose name is in `ends` (consumed up to the name; returned in
  // *end), or the end of the template when `ends` is empty.
  absl::Status ParseBody(const std::vector<absl::string_view>& ends, Body* body, std::string* end) {
    if (++depth_ > kMaxDepth) return SyntaxError(Peek().line, "blocks nest too deeply");
    while (true) {
      const Token& t = Peek();
      if (t.type == T::kEof) {
        if (ends.empty()) break;
        return SyntaxError(t.line, absl::StrCat("unexpected end of template; expected '",
                                                ends[0], "'"));
      }
      if (t.type == T::kText) {
        auto node = std::make_unique<Node>();
        node->type = Node::Type::kText;
        node->line = t.line;
        node->text = Next().text;
        body->push_back(std::move(node));
      } else if (t.type == T::kVarBegin) {
        Next();
        auto node = std::make_unique<Node>();
        node->type = Node::Type::kOutput;
        node->line = t.line;
        ASSIGN_OR_RETURN(node->expr, ParseExpression());
        if (Peek().type != T::kVarEnd) return Unexpected("'}}'");
        Next();
        body->push_back(std::move(node));
      } else if (t.type == T::kBlockBegin) {
        Next();
        if (Peek().type != T::kName) return Unexpected("a statement name");
        const std::string name = Peek().text;
        for (absl::string_view e : ends) {
          if (name == e) {
            Next();
            *end = name;
            --depth_;
            return absl::OkStatus();
          }
        }
        ASSIGN_OR_RETURN(NodePtr node, ParseStatement());
        body->push_back(std::move(node));
      } else {
        return Unexpected("text or a tag");
      }
    }
    --depth_;
    return absl::OkStatus();
  }

  absl::StatusOr<NodePtr> ParseStatement() {
    const Token& t = Next();
    auto node = std::make_unique<Node>();
    node->line = t.line;
    const std::string& name = t.text;
    std::string end;
    if (name == "if") {
      node->type = Node::Type::kIf;
      ASSIGN_OR_RETURN(ExprPtr cond, ParseExpression());
      RETURN_IF_ERROR(ExpectBlockEnd());
      while (true) {
        Body body;
        RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &body, &end));
        node->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "endif") break;
        if (end == "elif") {
          ASSIGN_OR_RETURN(cond, ParseExpression());
          RETURN_IF_ERROR(ExpectBlockEnd());
          continue;
        }
        RETURN_IF_ERROR(ExpectBlockEnd());
        Body else_body;
        RETURN_IF_ERROR(ParseBody({"endif"}, &else_body, &end));
        node->branches.emplace_back(nullptr, std::move(else_body));
        break;
      }
    } else if (name == "for") {
      node->type = Node::Type::kFor;
      do {
        ASSIGN_OR_RETURN(std::string target, ExpectName());
        node->targets.push_back(std::move(target));
      } while (AcceptOp(","));
      if (!AcceptName("in")) return Unexpected("'in'");
      ASSIGN_OR_RETURN(node->expr, ParseExpression(/*allow_condition=*/false));
      if (AcceptName("if")) {
        ASSIGN_OR_RETURN(node->condition, ParseExpression(/*allow_condition=*/false));
      }
      if (IsName("recursive")) return SyntaxError(t.line, "recursive loops are not supported");
      RETURN_IF_ERROR(ExpectBlockEnd());
      ++loop_depth_;
      absl::Status body_status = ParseBody({"else", "endfor"}, &node->body, &end);
      --loop_depth_;
      RETURN_IF_ERROR(body_status);
      if (end == "else") {
        RETURN_IF_ERROR(ExpectBlockEnd());
        RETURN_IF_ERROR(ParseBody({"endfor"}, &node->else_body, &end));
      }
    } else if (name == "set") {
      ASSIGN_OR_RETURN(std::string target, ExpectName());
      if (AcceptOp(".")) {
        node->target_object = target;
        ASSIGN_OR_RETURN(target, ExpectName());
      }
      node->targets.push_back(std::move(target));
      while (node->target_object.empty() && AcceptOp(",")) {
        ASSIGN_OR_RETURN(std::string more, ExpectName());
        node->targets.push_back(std::move(more));
      }
      if (AcceptOp("=")) {
        node->type = Node::Type::kSet;
        ASSIGN_OR_RETURN(node->expr, ParseTupleOrExpression());
      } else {
        if (node->targets.size() != 1 || !node->target_object.empty()) {
          return Unexpected("'='");
        }
        node->type = Node::Type::kSetBlock;
        if (IsOp("|")) {
          auto body_ref = std::make_unique<Expr>();
          body_ref->type = Expr::Type::kName;
          body_ref->name = "__body__";
          ASSIGN_OR_RETURN(node->expr, ParseFilters(std::move(body_ref)));
        }
        RETURN_IF_ERROR(ExpectBlockEnd());
        RETURN_IF_ERROR(ParseBody({"endset"}, &node->body, &end));
      }
    } else if (name == "macro") {
      node->type = Node::Type::kMacro;
      ASSIGN_OR_RETURN(node->text, ExpectName());
      RETURN_IF_ERROR(ParseParams(&node->params));
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseBody({"endmacro"}, &node->body, &end));
    } else if (name == "call") {
      node->type = Node::Type::kCallBlock;
      if (IsOp("(")) RETURN_IF_ERROR(ParseParams(&node->params));
      ASSIGN_OR_RETURN(node->expr, ParseExpression());
      if (node->expr->type != Expr::Type::kCall) {
        return SyntaxError(t.line, "expected a call after 'call'");
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseBody({"endcall"}, &node->body, &end));
    } else if (name == "filter") {
      node->type = Node::Type::kFilterBlock;
      auto body_ref = std::make_unique<Expr>();
      body_ref->type = Expr::Type::kName;
      body_ref->name = "__body__";
      // `{% filter upper %}` has no leading '|'.
      ASSIGN_OR_RETURN(node->expr, ParseFilterChain(std::move(body_ref), /*leading_bar=*/false));
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseBody({"endfilter"}, &node->body, &end));
    } else if (name == "generation") {
      node->type = Node::Type::kScope;
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseBody({"endgeneration"}, &node->body, &end));
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) {
        return SyntaxError(t.line, absl::StrCat("'", name, "' outside a loop"));
      }
      node->type = name == "break" ? Node::Type::kBreak : Node::Type::kContinue;
    } else {
      return SyntaxError(t.line, absl::StrCat("unknown tag '", name, "'"));
    }
    RETURN_IF_ERROR(ExpectBlockEnd());
    return node;
  }

  absl::Status ParseParams(std::vector<std::pair<std::string, ExprPtr>>* params) {
    RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      ASSIGN_OR_RETURN(std::string param, ExpectName());
      ExprPtr fallback;
      if (AcceptOp("=")) { ASSIGN_OR_RETURN(fallback, ParseExpression()); }
      params->emplace_back(std::move(param), std::move(fallback));
      if (!AcceptOp(",")) break;
    }
    return ExpectOp(")");
  }

  ExprPtr Make(Expr::Type type, int line) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->line = line;
    return e;
  }

  // `a, b` without parentheses (set's right-hand side) is a tuple.
  absl::StatusOr<ExprPtr> ParseTupleOrExpression() {
    const int line = Peek().line;
    ASSIGN_OR_RETURN(ExprPtr first, ParseExpression());
    if (!IsOp(",")) return first;
    ExprPtr tuple = Make(Expr::Type::kTuple, line);
    tuple->children.push_back(std::move(first));
    while (AcceptOp(",")) {
      if (Peek().type == T::kBlockEnd) break;
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
      tuple->children.push_back(std::move(item));
    }
    return tuple;
  }

  struct DepthGuard {
    explicit DepthGuard(int* d) : depth(d) { ++*depth; }
    ~DepthGuard() { --*depth; }
    int* depth;
  };

  absl::StatusOr<ExprPtr> ParseExpression(bool allow_condition = true) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return SyntaxError(Peek().line, "expression nests too deeply");
    ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    if (!allow_condition) return e;
    while (IsName("if")) {
      const int line = Next().line;
      ExprPtr cond = Make(Expr::Type::kCondition, line);
      ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
      ExprPtr otherwise;
      if (AcceptName("else")) { ASSIGN_OR_RETURN(otherwise, ParseExpression()); }
      cond->children.push_back(std::move(e));
      cond->children.push_back(std::move(test));
      cond->children.push_back(std::move(otherwise));
      e = std::move(cond);
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseBinaryLevel(int level) {
    // Levels: 0 or, 1 and, 2 not, 3 compare, 4 + -, 5 ~, 6 * / // %, 7 **, 8 unary.
    switch (level) {
      case 0:
      case 1: {
        const char* op = level == 0 ? "or" : "and";
        ASSIGN_OR_RETURN(ExprPtr left, ParseBinaryLevel(level + 1));
        while (IsName(op)) {
          const int line = Next().line;
          ASSIGN_OR_RETURN(ExprPtr right, ParseBinaryLevel(level + 1));
          ExprPtr b = Make(Expr::Type::kBinary, line);
          b->name = op;
          b->children.push_back(std::move(left));
          b->children.push_back(std::move(right));
          left = std::move(b);
        }
        return left;
      }
      case 2: {
        if (IsName("not")) {
          const int line = Next().line;
          DepthGuard guard(&depth_);
          if (depth_ > kMaxDepth) return SyntaxError(line, "expression nests too deeply");
          ASSIGN_OR_RETURN(ExprPtr operand, ParseBinaryLevel(2));
          ExprPtr u = Make(Expr::Type::kUnary, line);
          u->name = "not";
          u->children.push_back(std::move(operand));
          return u;
        }
        return ParseBinaryLevel(3);
      }
      case 3: {
        ASSIGN_OR_RETURN(ExprPtr left, ParseBinaryLevel(4));
        ExprPtr cmp;
        while (true) {
          std::string op;
          if (Peek().type == T::kOp && (Peek().text == "==" || Peek().text == "!=" ||
                                        Peek().text == "<" || Peek().text == ">" ||
                                        Peek().text == "<=" || Peek().text == ">=")) {
            op = Next().text;
          } else if (IsName("in")) {
            Next();
            op = "in";
          } else if (IsName("not") && IsName("in", 1)) {
            Next();
            Next();
            op = "not in";
          } else {
            break;
          }
          if (cmp == nullptr) {
            cmp = Make(Expr::Type::kCompare, left->line);
            cmp->children.push_back(std::move(left));
          }
          ASSIGN_OR_RETURN(ExprPtr right, ParseBinaryLevel(4));
          cmp->ops.push_back(std::move(op));
          cmp->children.push_back(std::move(right));
        }
        return cmp != nullptr ? std::move(cmp) : std::move(left);
      }
      case 4:
      case 5:
      case 6:
      case 7: {
        static const std::vector<std::vector<std::string>> kOps = {
            {"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
        const auto& ops = kOps[level - 4];
        ASSIGN_OR_RETURN(ExprPtr left, ParseBinaryLevel(level + 1));
        while (Peek().type == T::kOp &&
               std::find(ops.begin(), ops.end(), Peek().text) != ops.end()) {
          const Token& t = Next();
          ExprPtr b = Make(Expr::Type::kBinary, t.line);
          b->name = t.text;
          ASSIGN_OR_RETURN(ExprPtr right, ParseBinaryLevel(level + 1));
          b->children.push_back(std::move(left));
          b->children.push_back(std::move(right));
          left = std::move(b);
        }
        return left;
      }
      default:
        return ParseUnary(true);
    }
  }

  absl::StatusOr<ExprPtr> ParseOr() { return ParseBinaryLevel(0); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return SyntaxError(Peek().line, "expression nests too deeply");
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const Token& t = Next();
      e = Make(Expr::Type::kUnary, t.line);
      e->name = t.text;
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      e->children.push_back(std::move(operand));
    } else {
      ASSIGN_OR_RETURN(e, ParsePrimary());
      ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    }
    if (with_filter) return ParseFilters(std::move(e));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseFilters(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        ASSIGN_OR_RETURN(e, ParseFilterChain(std::move(e), /*leading_bar=*/true));
      } else if (IsName("is")) {
        const int line = Next().line;
        ExprPtr test = Make(Expr::Type::kTest, line);
        test->negated = AcceptName("not");
        ASSIGN_OR_RETURN(test->name, ExpectName());
        test->children.push_back(std::move(e));
        if (IsOp("(")) {
          RETURN_IF_ERROR(ParseCallArgs(test.get()));
        } else if (StartsBareTestArgument()) {
          ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          test->children.push_back(std::move(arg));
        }
        e = std::move(test);
      } else {
        return e;
      }
    }
  }

  // `x is divisibleby 3`, `x is sameas none`: one argument without parentheses.
  bool StartsBareTestArgument() const {
    const Token& t = Peek();
    if (t.type == T::kString || t.type == T::kInt || t.type == T::kFloat) return true;
    if (t.type == T::kOp) return t.text == "[" || t.text == "{";
    if (t.type != T::kName) return false;
    static constexpr absl::string_view kStop[] = {"else", "or", "and", "if", "in", "is", "not"};
    for (absl::string_view s : kStop) {
      if (t.text == s) return false;
    }
    return true;
  }

  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr e, bool leading_bar) {
    bool first = true;
    while (first ? (!leading_bar || AcceptOp("|")) : AcceptOp("|")) {
      first = false;
      const int line = Peek().line;
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      while (AcceptOp(".")) {  // dotted filter names
        ASSIGN_OR_RETURN(std::string part, ExpectName());
        absl::StrAppend(&name, ".", part);
      }
      ExprPtr f = Make(Expr::Type::kFilter, line);
      f->name = std::move(name);
      f->children.push_back(std::move(e));
      if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(f.get()));
      e = std::move(f);
    }
    return e;
  }

  absl::Status ParseCallArgs(Expr* call) {
    RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (Peek().type == T::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        call->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!call->kwargs.empty()) {
          return SyntaxError(Peek().line, "positional argument after keyword argument");
        }
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        call->children.push_back(std::move(value));
      }
      if (!AcceptOp(",")) break;
    }
    return ExpectOp(")");
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        const int line = Next().line;
        ExprPtr a;
        if (Peek().type == T::kInt) {
          a = Make(Expr::Type::kGetItem, line);
          ExprPtr index = Make(Expr::Type::kLiteral, line);
          index->literal = Value::Int(Next().int_value);
          a->children.push_back(std::move(e));
          a->children.push_back(std::move(index));
        } else {
          a = Make(Expr::Type::kGetAttr, line);
          ASSIGN_OR_RETURN(a->name, ExpectName());
          a->children.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (IsOp("[")) {
        const int line = Next().line;
        ExprPtr parts[3];
        int colons = 0;
        while (true) {
          if (IsOp(":")) {
            Next();
            if (++colons > 2) return Unexpected("']'");
            continue;
          }
          if (IsOp("]")) break;
          if (parts[colons] != nullptr) return Unexpected("':' or ']'");
          ASSIGN_OR_RETURN(parts[colons], ParseExpression());
        }
        Next();
        ExprPtr a;
        if (colons == 0) {
          if (parts[0] == nullptr) return SyntaxError(line, "empty subscript");
          a = Make(Expr::Type::kGetItem, line);
          a->children.push_back(std::move(e));
          a->children.push_back(std::move(parts[0]));
        } else {
          a = Make(Expr::Type::kSlice, line);
          a->children.push_back(std::move(e));
          for (auto& p : parts) a->children.push_back(std::move(p));
        }
        e = std::move(a);
      } else if (IsOp("(")) {
        ExprPtr call = Make(Expr::Type::kCall, Peek().line);
        call->children.push_back(std::move(e));
        RETURN_IF_ERROR(ParseCallArgs(call.get()));
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    switch (t.type) {
      case T::kString: {
        ExprPtr e = Make(Expr::Type::kLiteral, t.line);
        std::string s;
        while (Peek().type == T::kString) s += Next().text;  // adjacent literals join
        e->literal = Value::String(std::move(s));
        return e;
      }
      case T::kInt: {
        ExprPtr e = Make(Expr::Type::kLiteral, t.line);
        e->literal = Value::Int(Next().int_value);
        return e;
      }
      case T::kFloat: {
        ExprPtr e = Make(Expr::Type::kLiteral, t.line);
        e->literal = Value::Float(Next().float_value);
        return e;
      }
      case T::kName: {
        const std::string name = Next().text;
        ExprPtr e = Make(Expr::Type::kLiteral, t.line);
        if (name == "true" || name == "True") {
          e->literal = Value::Bool(true);
        } else if (name == "false" || name == "False") {
          e->literal = Value::Bool(false);
        } else if (name == "none" || name == "None") {
          e->literal = Value::None();
        } else {
          e->type = Expr::Type::kName;
          e->name = name;
        }
        return e;
      }
      case T::kOp:
        if (t.text == "(") {
          const int line = Next().line;
          if (AcceptOp(")")) return Make(Expr::Type::kTuple, line);
          ASSIGN_OR_RETURN(ExprPtr first, ParseExpression());
          if (AcceptOp(")")) return first;
          ExprPtr tuple = Make(Expr::Type::kTuple, line);
          tuple->children.push_back(std::move(first));
          while (AcceptOp(",")) {
            if (IsOp(")")) break;
            ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
            tuple->children.push_back(std::move(item));
          }
          RETURN_IF_ERROR(ExpectOp(")"));
          return tuple;
        }
        if (t.text == "[") {
          const int line = Next().line;
          ExprPtr list = Make(Expr::Type::kList, line);
          while (!IsOp("]")) {
            ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
            list->children.push_back(std::move(item));
            if (!AcceptOp(",")) break;
          }
          RETURN_IF_ERROR(ExpectOp("]"));
          return list;
        }
        if (t.text == "{") {
          const int line = Next().line;
          ExprPtr dict = Make(Expr::Type::kDict, line);
          while (!IsOp("}")) {
            ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
            RETURN_IF_ERROR(ExpectOp(":"));
            ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
            dict->children.push_back(std::move(key));
            dict->children.push_back(std::move(value));
            if (!AcceptOp(",")) break;
          }
          RETURN_IF_ERROR(ExpectOp("}"));
          return dict;
        }
        break;
      default:
        break;
    }
    return Unexpected("an expression");
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Template::Program>> ParseProgram(absl::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Lexer(source).Run());
  Parser parser(std::move(tokens));
  auto program = std::make_shared<Template::Program>();
  ASSIGN_OR_RETURN(program->body, parser.ParseTemplate());
  return program;
}

}  // namespace tandem::jinja
