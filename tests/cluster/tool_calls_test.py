"""Function calling (tools / tool_choice, docs/api.md) end to end: the official `openai` SDK
against a router in front of a prefill and a decode worker.

- tool_choice "required" and a named function on the default model (SmolLM2-135M-Instruct, whose
  ChatML template takes no tools: Tandem's fallback form): the grammar makes the output one call
  (or several) of the allowed functions; the arguments parse as JSON and validate with PyPI
  `jsonschema`; streamed (the deltas accumulated) equals not streamed with the same seed; n > 1
  and logprobs keep working; gRPC's last message carries the same calls; "auto" output (made
  certain by a regex response_format over gRPC) is parsed into content and calls; a strict tool
  under "auto" compiles its grammar.
- The rendered prompt: a multi-turn chat (an assistant's tool_calls, a tool result) with tools,
  through /tokenize, against Python jinja2 (configured as transformers configures it) rendering a
  Hermes-style template with the same messages and tools, on a copy of the default GGUF whose
  tokenizer.chat_template is that template (written with PyPI `gguf`).
About 11 s."""
import json
import subprocess
import sys

import grpc
import jsonschema
import openai
import pytest

from cluster_common import Cluster, Process, Protos, http_get, http_request, wait_router_ready

from tools_common import (ADD, DEFAULT_MODEL, QUESTION, TOOLS, WEATHER, accumulate, check_call,
                          jinja2_render, tokenize)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(prefill=1, decode=1, policy="kv_aware", tag="tc-")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.http_port}/v1", api_key="unused",
                         max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


@pytest.mark.parametrize("choice, parallel, allowed", [
    ("required", False, {"get_weather", "add"}),
    ({"type": "function", "function": {"name": "add"}}, False, {"add"}),
    ("required", True, {"get_weather", "add"}),
])
def test_forced_calls_streamed_and_not_are_the_same(client, model_id, choice, parallel, allowed):
    args = dict(model=model_id, messages=QUESTION, tools=TOOLS, tool_choice=choice,
                parallel_tool_calls=parallel, max_tokens=120, temperature=0.8, seed=11)
    whole = client.chat.completions.create(**args)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls", whole
    assert message.content is None, message
    assert message.tool_calls, message
    if not parallel:
        assert len(message.tool_calls) == 1, message.tool_calls
    for call in message.tool_calls:
        check_call(call, allowed, "hermes")

    content, calls, finish = accumulate(client.chat.completions.create(**args, stream=True))
    assert finish == "tool_calls"
    assert content is None
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (t.function.name, t.function.arguments) for t in message.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls)


def test_sdk_stream_helper_gives_the_same_calls(client, model_id):
    args = dict(model=model_id, messages=QUESTION, tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
                max_tokens=80, temperature=0.9, seed=5)
    whole = client.chat.completions.create(**args)
    with client.chat.completions.stream(**args) as stream:
        final = stream.get_final_completion()
    got = [(t.function.name, t.function.arguments) for t in final.choices[0].message.tool_calls]
    assert got == [(t.function.name, t.function.arguments)
                   for t in whole.choices[0].message.tool_calls]
    assert final.choices[0].finish_reason == "tool_calls"


def test_n_usage_and_logprobs_with_tools(client, model_id):
    whole = client.chat.completions.create(
        model=model_id, messages=QUESTION, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=80, temperature=1.0, seed=2, n=2, logprobs=True,
        top_logprobs=2)
    assert len(whole.choices) == 2
    for choice in whole.choices:
        assert choice.finish_reason == "tool_calls"
        assert len(choice.message.tool_calls) == 1
        check_call(choice.message.tool_calls[0], {"get_weather", "add"}, "hermes")
        # The log-probabilities are of the generated tokens, the call's text included.
        tokens = "".join(t.token for t in choice.logprobs.content)
        assert "<tool_call>" in tokens and choice.message.tool_calls[0].function.name in tokens
    assert whole.usage.completion_tokens == sum(
        len(c.logprobs.content) for c in whole.choices)
    assert whole.usage.prompt_tokens > 0


def test_tool_choice_none_and_auto_without_calls_are_plain_content(client, model_id):
    for choice in ("none", "auto"):
        whole = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Say hello."}], tools=TOOLS,
            tool_choice=choice, max_tokens=12, temperature=0, seed=1)
        message = whole.choices[0].message
        if not message.tool_calls:
            assert isinstance(message.content, str) and message.content, message
            assert whole.choices[0].finish_reason in ("stop", "length")
        else:  # the model may call on its own under "auto"
            assert choice == "auto"
            for call in message.tool_calls:
                check_call(call, {"get_weather", "add"}, "hermes")


def test_grpc_last_message_carries_the_calls(cluster):
    pb = Protos()
    inf = pb.inference
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
    request = inf.GenerateRequest(
        chat=inf.ChatMessages(messages=[inf.ChatMessage(role="user", content=QUESTION[0]["content"])]),
        tools=[inf.Tool(name="add", description="Adds two integers.",
                        parameters=json.dumps(ADD["function"]["parameters"]))],
        tool_choice=inf.ToolChoice(mode=inf.ToolChoice.MODE_REQUIRED), parallel_tool_calls=False,
        sampling=inf.SamplingParams(max_tokens=80, temperature=0.5, seed=4))
    responses = list(stub.Generate(request, timeout=120))
    text = "".join(r.text for r in responses)
    assert text.startswith("<tool_call>"), text
    assert all(not r.tool_calls for r in responses[:-1])
    (call,) = responses[-1].tool_calls
    assert call.name == "add" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), ADD["function"]["parameters"])
    # A bad tool_choice is INVALID_ARGUMENT.
    request.tool_choice.CopyFrom(inf.ToolChoice(mode=inf.ToolChoice.MODE_FUNCTION,
                                                function_name="nope"))
    with pytest.raises(grpc.RpcError) as error:
        list(stub.Generate(request, timeout=60))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nope" in error.value.details()


def test_auto_output_is_parsed_over_grpc(cluster):
    """tool_choice auto on an output made certain by a regex response_format (gRPC takes one):
    the text before the call is content, the good call is parsed, the malformed one is not."""
    pb = Protos()
    inf = pb.inference
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
    output = ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
              '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": }\n</tool_call>')
    regex = "".join("\\" + ch if ch in "{}[]()|.*+?^$\\" else ch for ch in output)
    request = inf.GenerateRequest(
        chat=inf.ChatMessages(messages=[inf.ChatMessage(role="user", content="2 + 3?")]),
        tools=[inf.Tool(name="add", parameters=json.dumps(ADD["function"]["parameters"]))],
        sampling=inf.SamplingParams(max_tokens=120, temperature=1.0, seed=1,
                                    response_format=inf.ResponseFormat(regex=regex)))
    responses = list(stub.Generate(request, timeout=120))
    assert "".join(r.text for r in responses) == output
    assert responses[-1].finish_reason == inf.FINISH_REASON_STOP
    assert [(c.name, json.loads(c.arguments)) for c in responses[-1].tool_calls] == [
        ("add", {"a": 2, "b": 3})]


def test_auto_with_a_strict_tool_is_constrained_and_refuses_response_format(client, model_id):
    """A strict tool under "auto" gets a grammar that lets the model write text or calls (this
    small model writes text); a response_format beside it is a 400."""
    strict = json.loads(json.dumps(ADD))
    strict["function"]["strict"] = True
    whole = client.chat.completions.create(
        model=model_id, messages=QUESTION, tools=[strict, WEATHER], max_tokens=16,
        temperature=0, seed=1)
    for call in whole.choices[0].message.tool_calls or []:
        check_call(call, {"get_weather", "add"}, "hermes")
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model=model_id, messages=QUESTION, tools=[strict], max_tokens=16,
            response_format={"type": "json_object"})
    assert error.value.body["param"] == "response_format"


HISTORY = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Oslo, and 2 + 3?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}},
        {"id": "call_2", "type": "function",
         "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": -3}'},
    {"role": "tool", "tool_call_id": "call_2", "name": "add", "content": "5"},
]

# A Hermes-style template of our own: tools listed as JSON in the system turn, an assistant's
# calls as <tool_call> blocks with its arguments through tojson, tool results as user turns.
HERMES_STYLE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}Functions you may call:
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
Call one as <tool_call>
{"name": <name>, "arguments": <object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}{% if m.role == 'system' %}{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% if m.content %}{{ m.content }}
{% endif %}{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>
{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def hermes_router(cluster, tmp_path_factory):
    """A second router over the same workers, reading a copy of the default GGUF whose chat
    template is HERMES_STYLE."""
    path = tmp_path_factory.mktemp("hermes") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(DEFAULT_MODEL),
                    str(path), "--chat-template", HERMES_STYLE, "--force"],
                   check=True, capture_output=True)
    addresses = ",".join(w.address for w in cluster.workers)
    router = Process("tandem-router", "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0",
                     f"--workers={addresses}", f"--model={path}")
    try:
        line = next(l for l in router.log if "listening on port " in l)
        router.http_port = int(line.split("(http port ")[1].split(",")[0])
        wait_router_ready(router, len(cluster.workers),
                          lambda: http_get(router.http_port, "/health")[0])
        yield router
    finally:
        router.kill()


def test_template_with_tools_renders_as_jinja2_does(hermes_router):
    port = hermes_router.http_port
    expected = jinja2_render(HERMES_STYLE, HISTORY, TOOLS)
    assert '{"name": "add", "arguments": {"a": 2, "b": 3}}' in expected  # the template's work
    ours = tokenize(port, {"messages": HISTORY, "tools": TOOLS})
    reference = tokenize(port, {"prompt": expected, "add_special_tokens": False})
    assert ours == reference
    # The same template, called, and parsed back.
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                           max_retries=0, timeout=120)
    whole = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=QUESTION, tools=TOOLS,
        tool_choice="required", parallel_tool_calls=False, max_tokens=80, temperature=0.5,
        seed=9)
    assert whole.choices[0].finish_reason == "tool_calls"
    check_call(whole.choices[0].message.tool_calls[0], {"get_weather", "add"}, "hermes")


def test_fallback_renders_tools_calls_and_results_as_text(cluster):
    """The default model's template takes no tools: the tools go into the system message, the
    calls and results into the documented text forms, through the model's own template."""
    port = cluster.http_port
    ids = tokenize(port, {"messages": HISTORY, "tools": TOOLS})
    status, reply = http_request(port, "POST", "/detokenize", {"tokens": ids})
    assert status == 200, reply
    prompt = reply["prompt"]
    assert prompt.startswith("<|im_start|>system\nYou are a weather bot.\n\n"), prompt
    for tool in TOOLS:
        assert json.dumps(tool, separators=(",", ":")) in prompt  # one line per tool
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Oslo", "unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "add", '
            '"arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>') in prompt, prompt
    assert ('<|im_start|>user\n<tool_response>\n{"temperature": -3}\n</tool_response>'
            '<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n'
            '<|im_start|>assistant\n') in prompt, prompt
    # Without tools, no system text about them.
    plain = tokenize(port, {"messages": HISTORY})
    assert len(plain) < len(ids)
