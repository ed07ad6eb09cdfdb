// The Jinja engine's error statuses and resource limits. What it renders is checked byte for byte
// against Python jinja2 in tests/tokenizer/jinja_reference_test.py; these are the behaviours that
// need no reference: malformed templates give INVALID_ARGUMENT with the line, failures while
// rendering FAILED_PRECONDITION with the line, and runaway templates RESOURCE_EXHAUSTED quickly.
#include "engine/tokenizer/jinja.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace tandem::jinja {
namespace {

absl::StatusOr<std::string> Render(const std::string& source, const RenderOptions& options = {}) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  ValueDict context;
  ValueList messages;
  ValueDict m;
  m.Set("role", Value::String("user"));
  m.Set("content", Value::String("Hi"));
  messages.push_back(Value::Dict(std::move(m)));
  context.Set("messages", Value::List(std::move(messages)));
  return t->Render(Value::Dict(std::move(context)), options);
}

TEST(JinjaTest, MalformedTemplatesAreInvalidArgumentWithTheirLine) {
  struct Case {
    const char* source;
    const char* line;  // the message starts with it
  };
  for (const Case& c : {
           Case{"{% if x %}a", "line 1:"},                     // unclosed block
           Case{"a\n{{ x + }}", "line 2:"},                    // missing operand
           Case{"{% for %}", "line 1:"},                       // missing loop variable
           Case{"ab\n\n{% endfor %}", "line 3:"},              // end tag without a block
           Case{"{{ 'unterminated }}", "line 1:"},             // unterminated string
           Case{"x\ny\n{% frobnicate %}", "line 3:"},          // unknown tag
           Case{"{{ a.}}", "line 1:"},                         // attribute without a name
           Case{"{% set %}", "line 1:"},                       // set without a target
           Case{"{{ (1, 2 }}", "line 1:"},                     // unbalanced parenthesis
           Case{"{% macro m( %}{% endmacro %}", "line 1:"},    // bad macro signature
           Case{"{{ x }", "line 1:"},                          // unterminated expression
           Case{"{# comment", "line 1:"},                      // unterminated comment
       }) {
    absl::StatusOr<Template> t = Template::Parse(c.source);
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.source;
    EXPECT_TRUE(absl::StartsWith(t.status().message(), c.line))
        << c.source << ": " << t.status().message();
  }
}

TEST(JinjaTest, DeepNestingIsRefusedNotOverflowed) {
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "(";
  EXPECT_EQ(Template::Parse("{{ " + deep + " }}").status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string blocks;
  for (int i = 0; i < 100000; ++i) blocks += "{% if 1 %}";
  EXPECT_EQ(Template::Parse(blocks).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JinjaTest, RenderFailuresAreFailedPreconditionWithTheirLine) {
  struct Case {
    const char* source;
    const char* message;  // a part of the message
  };
  for (const Case& c : {
           Case{"a\n{{ raise_exception('roles must alternate') }}", "line 2: "},
           Case{"{{ raise_exception('roles must alternate') }}", "roles must alternate"},
           Case{"{{ messages[0].content.nope.deeper }}", "line 1:"},
           Case{"{{ 1 + 'a' }}", "unsupported operand"},
           Case{"{{ x | no_such_filter }}", "no_such_filter"},
           Case{"{{ undefined_function() }}", "undefined_function"},
           Case{"{{ 1 // 0 }}", "division"},
       }) {
    absl::StatusOr<std::string> text = Render(c.source);
    ASSERT_FALSE(text.ok()) << c.source << " rendered " << *text;
    EXPECT_NE(text.status().code(), absl::StatusCode::kOk);
    EXPECT_TRUE(text.status().code() == absl::StatusCode::kFailedPrecondition ||
                // an unknown filter is found when parsing, as jinja2 does
                text.status().code() == absl::StatusCode::kInvalidArgument)
        << c.source << ": " << text.status();
    EXPECT_TRUE(absl::StrContains(text.status().message(), c.message))
        << c.source << ": " << text.status().message();
  }
  EXPECT_EQ(Render("{{ raise_exception('x') }}").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Each runaway template is stopped by its limit (small here, so the test is quick) with
// RESOURCE_EXHAUSTED, whether it writes output, loops, recurses, or grows a value it never
// prints.
TEST(JinjaTest, RunawayTemplatesAreResourceExhausted) {
  RenderOptions options;
  options.limits.max_output_bytes = 4096;
  options.limits.max_steps = 10000;
  options.limits.max_call_depth = 16;
  for (const char* source : {
           // output
           "{% for i in range(5000) %}xx{% endfor %}",
           "{{ 'x' * 5000 }}",
           // steps
           "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
           // recursion
           "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
           // values that double without being written
           "{% set s = 'xxxxxxxx' %}{% for i in range(40) %}{% set s = s ~ s %}{% endfor %}",
           "{% set s = 'xxxxxxxx' %}{% for i in range(40) %}{% set s = s + s %}{% endfor %}",
           "{% set l = [1, 2] %}{% for i in range(40) %}{% set l = l + l %}{% endfor %}",
           "{% set l = ['x' * 1000] * 100 %}",
           "{% set ns = namespace(s='xx') %}{% for i in range(40) %}"
           "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
           "{% set s = 'x' * 1000 %}{{ s.replace('x', s)|length }}",
           "{% set s = 'x' * 1000 %}{{ s|replace('x', s)|length }}",
           "{% set s = 'x' * 1000 %}{{ s.join([s, s, s, s, s])|length }}",
           "{% set s = 'x' * 1000 %}{{ [s, s, s, s, s]|join|length }}",
           "{% set s = 'x\\n' * 1000 %}{{ s|indent('xxxxxxxx')|length }}",
       }) {
    absl::StatusOr<std::string> text = Render(source, options);
    ASSERT_FALSE(text.ok()) << source;
    EXPECT_EQ(text.status().code(), absl::StatusCode::kResourceExhausted)
        << source << ": " << text.status();
    EXPECT_TRUE(absl::StartsWith(text.status().message(), "line 1:"))
        << source << ": " << text.status().message();
  }
  // Under the limits, the same constructs render.
  absl::StatusOr<std::string> small = Render("{{ ('x' * 100) ~ ('y' * 100) }}", options);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->size(), 200u);
}

TEST(JinjaTest, DefaultLimitsStopARangeThatIsTooBig) {
  EXPECT_EQ(Render("{% for i in range(1000000000) %}{% endfor %}").status().code(),
            absl::StatusCode::kResourceExhausted);
}

// A render frees everything it made, even what refers to itself: a macro and the frame that holds
// it, a macro defined in a macro and kept after that returned, a namespace that holds itself. A
// function in the context holds a probe; the context is dropped before rendering, so after the
// render the probe lives on only if something of the render does.
TEST(JinjaTest, ARenderFreesItsValuesEvenWhenTheyReferToThemselves) {
  for (const char* source : {
           "{% macro r(n) %}{% if n > 0 %}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}",
           "{% macro m() %}x{% endmacro %}{{ m() }}",
           "{% for i in [1, 2] %}{% macro m() %}{{ m }}{% endmacro %}{% endfor %}",
           "{% set ns = namespace() %}{% macro outer(y) %}{% macro inner() %}{{ y }}{% endmacro %}"
           "{% set ns.f = inner %}{% endmacro %}{{ outer(probe) }}{{ ns.f() }}",
           "{% macro wrap() %}{% set c = caller %}{{ c() }}{% endmacro %}"
           "{% call wrap() %}in{% endcall %}",
           "{% set ns = namespace(p=probe) %}{% set ns.me = ns %}",
           "{% set ns = namespace() %}{% set ns.l = [ns, probe] %}",
           // and when the render fails part way
           "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
           "{% macro m() %}x{% endmacro %}{{ raise_exception('stop') }}",
       }) {
    absl::StatusOr<Template> t = Template::Parse(source);
    ASSERT_TRUE(t.ok()) << source << ": " << t.status();
    auto probe = std::make_shared<int>(0);
    const std::weak_ptr<int> watched = probe;
    ValueDict context;
    context.Set("probe", Value::Function("probe", [probe](const CallArgs&) -> absl::StatusOr<Value> {
                  return Value::Int(*probe);
                }));
    Value context_value = Value::Dict(std::move(context));
    probe.reset();
    RenderOptions options;
    options.limits.max_call_depth = 8;
    (void)t->Render(context_value, options);
    context_value = Value();
    EXPECT_TRUE(watched.expired()) << source;
  }
  // A namespace the caller passed keeps what the template set in it.
  absl::StatusOr<Template> t = Template::Parse("{% set ns.x = 1 %}{% set ns.me = ns %}");
  ASSERT_TRUE(t.ok()) << t.status();
  Value ns = Value::Dict({}, /*is_namespace=*/true);
  ValueDict context;
  context.Set("ns", ns);
  ASSERT_TRUE(t->Render(Value::Dict(std::move(context)), {}).ok());
  EXPECT_NE(ns.dict().Find("x"), nullptr);
  EXPECT_NE(ns.dict().Find("me"), nullptr);
  ns.mutable_dict().entries.clear();  // the cycle the template made, broken
}

}  // namespace
}  // namespace tandem::jinja
