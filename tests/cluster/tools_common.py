"""The tools both function-calling tests (tool_calls_test.py, tool_formats_test.py) offer the
default model: a weather lookup with an enum and a bounded string, and an integer adder."""
import json
import pathlib
import re

import jinja2
import jinja2.ext
import jinja2.sandbox
import jsonschema

from cluster_common import http_request

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Adds two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                           "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def jinja2_render(template, messages, tools, today=None):
    """The template rendered as transformers' apply_chat_template does: its jinja2 settings,
    tojson, raise_exception and strftime_now (at `today`, a datetime; none without it), each
    call's arguments parsed from the JSON string the client sent."""
    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    if today is not None:
        env.globals["strftime_now"] = today.strftime
    messages = json.loads(json.dumps(messages))
    for m in messages:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return env.from_string(template).render(messages=messages, tools=tools,
                                            add_generation_prompt=True, bos_token="<|im_start|>",
                                            eos_token="<|im_end|>")


def tokenize(port, body):
    status, reply = http_request(port, "POST", "/tokenize", body)
    assert status == 200, reply
    return reply["tokens"]


# The ids each call format gives its calls (router/server/tool_calls.cc).
CALL_IDS = {"hermes": "call_[A-Za-z0-9]{24}", "llama": "call_[A-Za-z0-9]{24}",
            "mistral": "[A-Za-z0-9]{9}"}


def check_call(call, allowed, fmt):
    """A parsed call: its format's id, one of the `allowed` functions, arguments valid against
    that function's parameters."""
    assert call.type == "function"
    assert re.fullmatch(CALL_IDS[fmt], call.id), call.id
    assert call.function.name in allowed, call.function.name
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def accumulate(chunks):
    """The streamed chunks of choice 0 put together as a client does: content, tool_calls by
    index (id, name and arguments appended), finish_reason."""
    content, calls, finish = None, {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            assert choice.index == 0
            delta = choice.delta
            if delta.content:
                content = (content or "") + delta.content
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += call.id or ""
                if call.function is not None:
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish
