"""Function calling in the call formats of templates that do not use Hermes' <tool_call> blocks
(docs/api.md, "Function calling"): Llama 3.1+ JSON (`{"name", "parameters"}` as the whole output,
tool results as ipython turns) and Mistral (`[TOOL_CALLS] [{"name", "arguments"}, ...]`, call ids
of 9 letters and digits). Each runs on a copy of the default GGUF (SmolLM2-135M-Instruct, written
with PyPI `gguf`) whose tokenizer.chat_template is a Llama-3.1-style or Mistral-style template
written for this test, behind its own router over the same prefill and decode workers:

- the rendered prompt of a multi-turn chat with tools, a call and its result (through /tokenize)
  is the same token ids as jinja2 (configured as transformers configures it) rendering the same
  template with the same messages and tools; the same for the real Llama 3.1 / 3.2 / 3.3 and
  Mistral Nemo templates from llama.cpp's models/templates/ (scripts/fetch_chat_templates.sh);
- tool_choice "required" and a named function: the grammar makes the output the format's calls,
  parsed into tool_calls whose arguments validate with PyPI `jsonschema`, ids as the format wants,
  streamed (accumulated) equal to not streamed with the same seed; gRPC's text is the format's;
- "auto": output in the format (made certain by a response_format) is parsed over HTTP (streamed
  and not) and gRPC, a malformed call staying content; a strict tool's triggered grammar compiles;
- a Mistral history whose call id is not 9 characters is a 400 with the template's message; a
  template that takes tools in none of the formats refuses tools and calls with a 400.
About 30 s on a 2-core machine (most of it starting a router per template)."""
import datetime
import json
import os
import pathlib
import subprocess
import sys

import grpc
import jsonschema
import openai
import pytest

from cluster_common import Cluster, Process, Protos, http_get, wait_router_ready

from tools_common import (ADD, DEFAULT_MODEL, QUESTION, TOOLS, WEATHER, accumulate, check_call,
                          jinja2_render, tokenize)

# One call per assistant message (Llama 3.1's template refuses more) and a 9-character id
# (Mistral's refuse others); user and assistant turns alternate around the call (Mistral's check).
HISTORY = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "abcDEF123", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": '{"temperature": -3}'},
    {"role": "assistant", "content": "It is -3 degrees in Oslo."},
    {"role": "user", "content": "And 2 + 3?"},
]

# Llama-3.1-style, written for this test: the tools as indented JSON in the first user turn, an
# assistant's calls as {"name", "parameters"} objects separated by "; ", results as ipython turns.
LLAMA_STYLE = """\
{{- bos_token }}
{%- if messages[0].role == 'system' %}
{%- set system = messages[0].content | trim %}
{%- set messages = messages[1:] %}
{%- else %}
{%- set system = '' %}
{%- endif %}
<|start_header_id|>system<|end_header_id|>

{% if tools is defined and tools %}Environment: ipython
{% endif %}{{ system }}<|eot_id|>
{%- for m in messages %}
{%- if loop.first and tools is defined and tools and m.role == 'user' %}\
<|start_header_id|>user<|end_header_id|>

When a function helps, answer only with {"name": <its name>, "parameters": <its arguments>}.

{% for t in tools %}{{ t | tojson(indent=2) }}

{% endfor %}{{ m.content | trim }}<|eot_id|>
{%- elif m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for c in m.tool_calls %}{% if not loop.first %}; {% endif %}\
{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}\
{% endfor %}<|eot_id|>
{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content | trim }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# Mistral-style, written for this test: the tools before the last user turn, an assistant's calls
# as one [TOOL_CALLS] list with their ids (9 characters, or the template refuses), results as
# [TOOL_RESULTS] objects.
MISTRAL_STYLE = """\
{{- bos_token }}
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}\
{% endfor %}
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- elif m.role == 'user' %}
{%- if tools is defined and tools and loop.index0 == ns.last_user %}\
[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]\
{% if loop.index0 == ns.last_user and messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}{{ m.content }}[/INST]
{%- elif m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}\
{% if c.id | length != 9 %}{{ raise_exception('tool call ids must be 9 letters and digits') }}\
{% endif %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}, \
"id": "{{ c.id }}"}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}
{%- elif m.role == 'tool' %}[TOOL_RESULTS]{"content": {{ m.content | tojson }}, \
"call_id": "{{ m.tool_call_id }}"}[/TOOL_RESULTS]
{%- else %}{{ m.content }}{{ eos_token }}
{%- endif %}
{%- endfor %}"""


def real_templates():
    """llama.cpp's copies of the real templates (scripts/fetch_chat_templates.sh, which
    scripts/setup.sh runs, puts them in ~/.cache/tandem/chat-templates)."""
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")))
    dirs = [os.environ.get("TANDEM_CHAT_TEMPLATES_DIR", ""),
            str(cache / "tandem/chat-templates/llama.cpp-0.3.36")]
    found = {}
    for name, fmt in [("meta-llama-Llama-3.1-8B-Instruct", "llama"),
                      ("meta-llama-Llama-3.2-3B-Instruct", "llama"),
                      ("meta-llama-Llama-3.3-70B-Instruct", "llama"),
                      ("mistralai-Mistral-Nemo-Instruct-2407", "mistral")]:
        for d in dirs:
            path = pathlib.Path(d) / f"{name}.jinja" if d else None
            if path is not None and path.is_file():
                found[name] = (path.read_text(), fmt)
                break
    assert len(found) == 4, f"llama.cpp's templates are missing ({dirs}): run scripts/setup.sh"
    return found


REAL = real_templates()
TEMPLATES = {"llama-style": (LLAMA_STYLE, "llama"), "mistral-style": (MISTRAL_STYLE, "mistral"),
             **REAL}
# Takes tools, but writes calls in a form none of the formats is (the newer Mistral one).
OTHER_STYLE = """\
{%- for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}[TOOL_CALLS]\
{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}{% endfor %}\
{% else %}{{ m.role }}: {{ m.content }}
{% endif %}{% endfor %}{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]\
{% endif %}"""


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(prefill=1, decode=1, policy="kv_aware", tag="tf-")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def routers(cluster, tmp_path_factory):
    """name -> a router over the cluster's workers reading a copy of the default GGUF whose chat
    template is TEMPLATES[name], started on first use."""
    started = {}

    def get(name):
        if name not in started:
            path = tmp_path_factory.mktemp(name) / "SmolLM2-135M-Instruct.Q4_1.gguf"
            template = OTHER_STYLE if name == "other-style" else TEMPLATES[name][0]
            subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata",
                            str(DEFAULT_MODEL), str(path), "--chat-template", template,
                            "--force"], check=True, capture_output=True)
            addresses = ",".join(w.address for w in cluster.workers)
            router = Process("tandem-router", "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0",
                             f"--workers={addresses}", f"--model={path}")
            started[name] = router
            line = next(l for l in router.log if "listening on port " in l)
            router.http_port = int(line.split("(http port ")[1].split(",")[0])
            wait_router_ready(router, len(cluster.workers),
                              lambda: http_get(router.http_port, "/health")[0])
        return started[name]
    yield get
    for router in started.values():
        router.kill()


def client_of(router):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{router.http_port}/v1", api_key="unused",
                         max_retries=0, timeout=120)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_prompt_renders_as_jinja2_does(routers, name):
    template, fmt = TEMPLATES[name]
    router = routers(name)
    before = datetime.datetime.now(datetime.timezone.utc)
    ours = tokenize(router.http_port, {"messages": HISTORY, "tools": TOOLS})
    after = datetime.datetime.now(datetime.timezone.utc)
    expected = [jinja2_render(template, HISTORY, TOOLS, day) for day in (before, after)]
    # The template's own work: the call and the result as the format writes them.
    if fmt == "llama":
        assert '"parameters": {"city": "Oslo", "unit": "celsius"}' in expected[0]
    else:
        assert '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", ' in expected[0]
        assert "[AVAILABLE_TOOLS]" in expected[0]
    references = [tokenize(router.http_port, {"prompt": e, "add_special_tokens": False})
                  for e in expected]
    assert ours in references
    # Without tools, the template renders without them (and differently).
    plain = tokenize(router.http_port, {"messages": HISTORY})
    assert plain != ours


FORMATS = {"llama": "llama-style", "mistral": "mistral-style"}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("choice, parallel, allowed", [
    ("required", False, {"get_weather", "add"}),
    ({"type": "function", "function": {"name": "add"}}, False, {"add"}),
    ("required", True, {"get_weather", "add"}),
])
def test_forced_calls_streamed_and_not_are_the_same(routers, fmt, choice, parallel, allowed):
    client = client_of(routers(FORMATS[fmt]))
    args = dict(model=client.models.list().data[0].id, messages=QUESTION, tools=TOOLS,
                tool_choice=choice, parallel_tool_calls=parallel, max_tokens=120,
                temperature=0.8, seed=11)
    whole = client.chat.completions.create(**args)
    message = whole.choices[0].message
    content, calls, finish = accumulate(client.chat.completions.create(**args, stream=True))
    assert (content, finish) == (message.content, whole.choices[0].finish_reason)
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (t.function.name, t.function.arguments) for t in message.tool_calls or []]
    if parallel and fmt == "mistral" and whole.choices[0].finish_reason == "length":
        # This small model, free to go on, keeps adding calls to its one list until max_tokens
        # cuts it: the cut-off list stays content, as written, never dropped.
        assert message.content.startswith('[TOOL_CALLS][{"name": "'), message
        assert not message.tool_calls
        return
    assert whole.choices[0].finish_reason == "tool_calls", whole
    assert message.content is None, message
    assert message.tool_calls, message
    if not parallel:
        assert len(message.tool_calls) == 1, message.tool_calls
    for call in message.tool_calls:
        check_call(call, allowed, fmt)


def grpc_stub(router):
    pb = Protos()
    return pb, pb.inference_grpc.InferenceStub(
        grpc.insecure_channel(f"127.0.0.1:{router.port}"))


@pytest.mark.parametrize("fmt, prefix", [("llama", '{"name": "add", "parameters": '),
                                         ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": ')])
def test_grpc_text_is_the_formats(routers, fmt, prefix):
    pb, stub = grpc_stub(routers(FORMATS[fmt]))
    inf = pb.inference
    request = inf.GenerateRequest(
        chat=inf.ChatMessages(messages=[inf.ChatMessage(role="user", content="2 + 3?")]),
        tools=[inf.Tool(name="add", parameters=json.dumps(ADD["function"]["parameters"]))],
        tool_choice=inf.ToolChoice(mode=inf.ToolChoice.MODE_REQUIRED), parallel_tool_calls=False,
        sampling=inf.SamplingParams(max_tokens=80, temperature=0.5, seed=4))
    responses = list(stub.Generate(request, timeout=120))
    text = "".join(r.text for r in responses)
    assert text.startswith(prefix), text
    (call,) = responses[-1].tool_calls
    assert call.name == "add"
    assert len(call.id) == 9 if fmt == "mistral" else call.id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), ADD["function"]["parameters"])


def regex_of(text):
    return "".join("\\" + ch if ch in "{}[]()|.*+?^$\\" else ch for ch in text)


@pytest.mark.parametrize("fmt, output, calls", [
    ("llama", '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}; '
              '{"name": "add", "parameters": {"a": }}',
     [("add", {"a": 2, "b": 3})]),
    ("mistral", 'Let me add.\n[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}, '
                '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}]'
                '[TOOL_CALLS] [{"name": "nope", "arguments": {}}]',
     [("add", {"a": 2, "b": 3}), ("get_weather", {"city": "Oslo", "unit": "celsius"})]),
])
def test_auto_output_is_parsed_over_grpc(routers, fmt, output, calls):
    """tool_choice auto on an output made certain by a regex response_format (gRPC takes one):
    the good calls parsed, the malformed or unknown ones left in the text."""
    pb, stub = grpc_stub(routers(FORMATS[fmt]))
    inf = pb.inference
    request = inf.GenerateRequest(
        chat=inf.ChatMessages(messages=[inf.ChatMessage(role="user", content="2 + 3?")]),
        tools=[inf.Tool(name=t["function"]["name"],
                        parameters=json.dumps(t["function"]["parameters"])) for t in TOOLS],
        sampling=inf.SamplingParams(max_tokens=150, temperature=1.0, seed=1,
                                    response_format=inf.ResponseFormat(regex=regex_of(output))))
    responses = list(stub.Generate(request, timeout=120))
    assert "".join(r.text for r in responses) == output
    assert [(c.name, json.loads(c.arguments)) for c in responses[-1].tool_calls] == calls


def test_llama_auto_call_over_http_streamed_and_not(routers):
    """Under "auto" (no grammar from the tools) a Llama-format call forced by a JSON schema
    response_format is parsed into tool_calls, streamed and not alike."""
    client = client_of(routers(FORMATS["llama"]))
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
              "properties": {"name": {"type": "string", "enum": ["add"]},
                             "parameters": ADD["function"]["parameters"] | {
                                 "additionalProperties": False}}}
    args = dict(model=client.models.list().data[0].id, messages=QUESTION, tools=TOOLS,
                max_tokens=80, temperature=0.7, seed=3,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "call", "schema": schema}})
    whole = client.chat.completions.create(**args)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls", whole
    assert message.content is None
    (call,) = message.tool_calls
    check_call(call, {"add"}, "llama")
    content, calls, finish = accumulate(client.chat.completions.create(**args, stream=True))
    assert (content, finish) == (None, "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [("add", call.function.arguments)]


def test_mistral_history_with_a_bad_call_id_is_refused(routers):
    client = client_of(routers(FORMATS["mistral"]))
    history = json.loads(json.dumps(HISTORY))
    history[2]["tool_calls"][0]["id"] = "call_1"
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=client.models.list().data[0].id, messages=history,
                                       tools=TOOLS, max_tokens=8)
    assert "9 letters and digits" in error.value.body["message"], error.value.body


def test_a_template_in_no_known_format_refuses_tools(routers):
    client = client_of(routers("other-style"))
    model = client.models.list().data[0].id
    for body, param in [(dict(messages=QUESTION, tools=TOOLS), "tools"),
                        (dict(messages=HISTORY), "messages")]:
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(model=model, max_tokens=8, **body)
        assert error.value.body["param"] == param, error.value.body
        assert "form Tandem does not parse" in error.value.body["message"]
    # Without tools or calls it serves the chat.
    reply = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4)
    assert reply.choices[0].message.content is not None


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_auto_with_a_strict_tool_compiles_the_formats_grammar(routers, fmt):
    """A strict tool under "auto": the format's triggered grammar compiles and the request runs;
    whatever calls the model makes are valid."""
    client = client_of(routers(FORMATS[fmt]))
    strict = json.loads(json.dumps(ADD))
    strict["function"]["strict"] = True
    for seed in (1, 2):
        whole = client.chat.completions.create(
            model=client.models.list().data[0].id, messages=QUESTION, tools=[strict, WEATHER],
            max_tokens=40, temperature=1.0, seed=seed)
        assert whole.choices[0].finish_reason in ("stop", "length", "tool_calls"), whole
        for call in whole.choices[0].message.tool_calls or []:
            check_call(call, {"get_weather", "add"}, fmt)
