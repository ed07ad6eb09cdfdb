"""The OpenAI HTTP API as clients use it, against a real cluster on loopback (1 prefill + 1 decode
worker behind a router): a catalogue of bad requests, each refused with its status and the
parameter its error names (and the gRPC equivalents); log-probabilities through the `openai` SDK,
their values against llama.cpp's on the same tokens; n and best_of; stop arrays; /tokenize and
/detokenize against llama.cpp's tokenizer; cached_tokens from the prefix cache."""
import json
import math
import sys
from pathlib import Path

import grpc
import numpy as np
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from cluster_common import Cluster, Protos, http_request  # noqa: E402
from reference_common import DEFAULT_MODEL, NEAR_TIE  # noqa: E402

import llama_cpp  # noqa: E402  -- installed by scripts/setup.sh

# As the engine's reference tests (tests/engine/forward_reference_test.py): the two engines
# differ by quantization noise on this Q4_1 model, 0.16-0.25 logits on average.
MAX_MEAN_DIFF = 0.35

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(prefill=1, decode=1, tag="oa-")
    yield c
    c.stop()


MODEL = "SmolLM2-135M-Instruct.Q4_1"  # the id the router gives the default model


@pytest.fixture(scope="module")
def client(cluster):
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.http_port}/v1", api_key="unused",
                      max_retries=0)
    assert [m.id for m in c.models.list()] == [MODEL]
    return c


@pytest.fixture(scope="module")
def llm():
    return llama_cpp.Llama(model_path=str(DEFAULT_MODEL), n_ctx=512, n_batch=512, logits_all=True,
                           n_threads=2, verbose=False, seed=0)


# ------------------------------------------------------------------------------------------------
# 1. Bad requests: (path, body, status, the param the error names).
# ------------------------------------------------------------------------------------------------

C, CHAT = "/v1/completions", "/v1/chat/completions"


def c(**fields):
    return {"prompt": "hi", "max_tokens": 2, **fields}


def ch(**fields):
    return {"messages": USER, "max_tokens": 2, **fields}


CATALOGUE = [
    # Unknown parameters.
    (C, c(frobnicate=1), 400, "frobnicate"),
    (C, c(response_format={"type": "yaml"}), 400, "response_format.type"),
    (C, c(messages=USER), 400, "messages"),
    (C, c(top_logprobs=2), 400, "top_logprobs"),
    (CHAT, ch(prompt="hi"), 400, "prompt"),
    (CHAT, ch(best_of=2), 400, "best_of"),
    (CHAT, ch(echo=True), 400, "echo"),
    (CHAT, ch(suffix="x"), 400, "suffix"),
    (CHAT, ch(frobnicate=True), 400, "frobnicate"),
    # Features Tandem does not have (yet), refused unless they ask for nothing.
    (C, c(echo="yes"), 400, "echo"),
    (C, c(echo=True, max_tokens=-1), 400, "max_tokens"),
    (C, c(suffix="the end"), 400, "suffix"),
    (C, c(logit_bias={"50256": -100}), 400, "logit_bias"),
    (CHAT, ch(logit_bias={"1": 1}), 400, "logit_bias"),
    # Structured output: malformed response_format objects (tests/cluster/structured_output_test.py
    # has the working ones and a schema that does not compile).
    (CHAT, ch(response_format={"type": "json_object", "strict": True}), 400,
     "response_format.strict"),
    (CHAT, ch(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
     400, "response_format.json_schema.name"),
    (CHAT, ch(response_format="json"), 400, "response_format"),
    # Function calling (tests/cluster/tool_calls_test.py has the working requests).
    (CHAT, ch(tools={"type": "function", "function": {"name": "f"}}), 400, "tools"),
    (CHAT, ch(tools=[{"type": "function"}]), 400, "tools[0].function"),
    (CHAT, ch(tools=[{"type": "retrieval", "function": {"name": "f"}}]), 400, "tools[0].type"),
    (CHAT, ch(tools=[{"type": "function", "function": {"description": "x"}}]), 400,
     "tools[0].function.name"),
    (CHAT, ch(tools=[{"type": "function", "function": {"name": "get weather"}}]), 400,
     "tools[0].function.name"),
    (CHAT, ch(tools=[{"type": "function", "function": {"name": "f"}}] * 2), 400,
     "tools[1].function.name"),
    (CHAT, ch(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), 400,
     "tools[0].function.parameters"),
    (CHAT, ch(tools=[{"type": "function", "function": {"name": "f", "arguments": {}}}]), 400,
     "tools[0].function.arguments"),
    (CHAT, ch(tool_choice="required"), 400, "tool_choice"),
    (CHAT, ch(tool_choice="always", tools=[{"type": "function", "function": {"name": "f"}}]), 400,
     "tool_choice"),
    (CHAT, ch(tool_choice={"type": "function", "function": {"name": "g"}},
              tools=[{"type": "function", "function": {"name": "f"}}]), 400,
     "tool_choice.function.name"),
    (CHAT, ch(tool_choice="required", tools=[{"type": "function", "function": {"name": "f"}}],
              response_format={"type": "json_object"}), 400, "response_format"),
    (CHAT, ch(functions=[{"name": "f"}]), 400, "functions"),
    (CHAT, ch(function_call="auto"), 400, "function_call"),
    (CHAT, ch(parallel_tool_calls=True), 400, "parallel_tool_calls"),
    (CHAT, ch(store=True), 400, "store"),
    (CHAT, ch(metadata={"k": "v"}), 400, "metadata"),
    (CHAT, ch(modalities=["text", "audio"]), 400, "modalities"),
    (CHAT, ch(audio={"voice": "alloy", "format": "wav"}), 400, "audio"),
    (CHAT, ch(prediction={"type": "content", "content": "x"}), 400, "prediction"),
    (CHAT, ch(reasoning_effort="high"), 400, "reasoning_effort"),
    (CHAT, ch(service_tier="flex"), 400, "service_tier"),
    (CHAT, ch(web_search_options={}), 400, "web_search_options"),
    # Values out of range or of the wrong type.
    (C, c(max_tokens=0), 400, "max_tokens"),
    (C, c(max_tokens=-3), 400, "max_tokens"),
    (C, c(max_tokens=2.5), 400, "max_tokens"),
    (C, c(max_tokens="4"), 400, "max_tokens"),
    (C, c(temperature=2.5), 400, "temperature"),
    (C, c(temperature=-0.5), 400, "temperature"),
    (C, c(temperature="warm"), 400, "temperature"),
    (C, c(top_p=0), 400, "top_p"),
    (C, c(top_p=1.5), 400, "top_p"),
    (C, c(top_k=-2), 400, "top_k"),
    (C, c(min_p=1.5), 400, "min_p"),
    (C, c(presence_penalty=2.5), 400, "presence_penalty"),
    (C, c(frequency_penalty=-3), 400, "frequency_penalty"),
    (C, c(repetition_penalty=0), 400, "repetition_penalty"),
    (C, c(seed="abc"), 400, "seed"),
    (C, c(seed=1.5), 400, "seed"),
    (C, c(n=0), 400, "n"),
    (C, c(n=129), 400, "n"),
    (C, c(n=3, best_of=2), 400, "best_of"),
    (C, c(best_of=21), 400, "best_of"),
    (C, c(best_of=2, stream=True), 400, "best_of"),
    (C, c(logprobs=21), 400, "logprobs"),
    (C, c(logprobs=-1), 400, "logprobs"),
    (C, c(logprobs=True), 400, "logprobs"),
    (C, c(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    (C, c(stop=""), 400, "stop"),
    (C, c(stop=[1]), 400, "stop"),
    (C, c(stream="yes"), 400, "stream"),
    (C, c(stream_options={"include_usage": True}), 400, "stream_options"),
    (C, c(stream=True, stream_options={"include_usage": "yes"}), 400,
     "stream_options.include_usage"),
    (C, c(user=7), 400, "user"),
    (C, c(min_tokens=5), 400, "min_tokens"),
    (C, c(ignore_eos="true"), 400, "ignore_eos"),
    (C, c(priority=2**40), 400, "priority"),
    (C, c(slo={"ttft_ms": -5}), 400, "slo.ttft_ms"),
    (C, c(stop_token_ids=["x"]), 400, "stop_token_ids"),
    (CHAT, ch(logprobs=3), 400, "logprobs"),
    (CHAT, ch(top_logprobs=3), 400, "top_logprobs"),
    (CHAT, ch(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    (CHAT, ch(max_tokens=None, max_completion_tokens=0), 400, "max_completion_tokens"),
    (CHAT, ch(max_tokens=3, max_completion_tokens=4), 400, "max_tokens"),  # both, differing
    (CHAT, ch(n=200), 400, "n"),
    # Prompts and messages.
    (C, {"max_tokens": 2}, 400, "prompt"),
    (C, c(prompt=None), 400, "prompt"),
    (C, c(prompt=""), 400, "prompt"),
    (C, c(prompt=["one", ""]), 400, "prompt[1]"),  # a batch with an empty prompt
    (C, c(prompt=["one", [1, "x"]]), 400, "prompt[1]"),
    (C, c(prompt=["x"] * 257), 400, "prompt"),
    (C, c(prompt={"text": "hi"}), 400, "prompt"),
    (C, c(prompt=[10**9]), 400, "prompt"),
    (C, c(prompt="hello " * 9000), 400, "prompt"),
    (C, c(max_tokens=8192), 400, "max_tokens"),
    (C, c(model="gpt-9"), 404, "model"),
    (CHAT, {"max_tokens": 2}, 400, "messages"),
    (CHAT, ch(messages=[]), 400, "messages"),
    (CHAT, ch(messages="hi"), 400, "messages"),
    (CHAT, ch(messages=[{"role": "user"}]), 400, "messages[0].content"),
    (CHAT, ch(messages=[{"role": "user", "content": None}]), 400, "messages[0].content"),
    (CHAT, ch(messages=[{"role": "system", "content": "x"}, {"role": "user", "content": ""}]), 400,
     "messages[1].content"),
    (CHAT, ch(messages=USER + [{"role": "assistant", "content": None}]), 400,
     "messages[1].content"),
    (CHAT, ch(messages=[{"content": "hi"}]), 400, "messages[0].role"),
    (CHAT, ch(messages=[{"role": "robot", "content": "hi"}]), 400, "messages[0].role"),
    (CHAT, ch(messages=USER + [{"role": "tool", "content": "4"}]), 400,
     "messages[1].tool_call_id"),
    (CHAT, ch(messages=USER + [{"role": "function", "content": "4", "name": "f"}]), 400,
     "messages[1].role"),
    (CHAT, ch(messages=[{"role": "user", "content": "hi", "tool_calls": [{"id": "c1"}]}]), 400,
     "messages[0].tool_calls"),
    (CHAT, ch(messages=USER + [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]),
     400, "messages[1].tool_calls[0].function.arguments"),
    (CHAT, ch(messages=USER + [{"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
     400, "messages[1].tool_calls[0].id"),
    (CHAT, ch(messages=[{"role": "user", "content": "hi", "name": "bob"}]), 400,
     "messages[0].name"),
    (CHAT, ch(messages=[{"role": "assistant", "content": None,
                         "tool_calls": [{"id": "c1", "type": "function"}]}]), 400,
     "messages[0].tool_calls[0].function"),
    (CHAT, ch(messages=[{"role": "user", "content": [{"type": "image_url",
                                                      "image_url": {"url": "x"}}]}]), 400,
     "messages[0].content[0].type"),
    (CHAT, ch(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (CHAT, ch(model="gpt-9"), 404, "model"),
    # /tokenize and /detokenize.
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": USER}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "add_special_tokens": "no"}, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "a", "model": "gpt-9"}, 404, "model"),
    ("/tokenize", {"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ("/tokenize", {"prompt": "a", "extra": 1}, 400, "extra"),
    ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
    ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "model": "gpt-9"}, 404, "model"),
]


def test_catalogue_of_bad_requests(cluster):
    assert len(CATALOGUE) >= 60
    for path, body, status, param in CATALOGUE:
        got, reply = http_request(cluster.http_port, "POST", path, body)
        shown = (path, json.dumps(body)[:120], reply)
        assert got == status, shown
        error = reply["error"]
        assert error["param"] == param, shown
        assert param.split("[")[0].split(".")[0] in error["message"], shown
        assert error["type"] == "invalid_request_error" and error["code"], shown
    # Asking for nothing is accepted: fields that clients send with their default values.
    for path, body in [
        (C, c(n=1, best_of=1, echo=False, suffix=None, logit_bias={}, user="u-1",
              presence_penalty=0, frequency_penalty=0, stream=False, logprobs=None)),
        (CHAT, ch(user="u-1", n=1, store=False, metadata={}, service_tier="auto",
                  modalities=["text"], response_format={"type": "text"}, tools=[],
                  tool_choice="none", logprobs=False, parallel_tool_calls=None,
                  messages=[{"role": "developer", "content": "Be brief."}] + USER)),
    ]:
        got, reply = http_request(cluster.http_port, "POST", path, body)
        assert got == 200, (path, reply)


def test_grpc_refuses_the_same_naming_the_field(cluster):
    pb = Protos()
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
    SP, Msg = pb.inference.SamplingParams, pb.inference.ChatMessage
    chat = lambda *m: pb.inference.ChatMessages(messages=list(m))  # noqa: E731
    cases = [
        (dict(prompt="hi", sampling=SP(logprobs=21)), "logprobs"),
        (dict(prompt="hi", sampling=SP(max_tokens=1, prompt_logprobs=21)), "prompt_logprobs"),
        (dict(prompt="hi", sampling=SP(temperature=-1)), "temperature"),
        (dict(prompt="hi", sampling=SP(top_p=1.5)), "top_p"),
        (dict(prompt="hi", sampling=SP(max_tokens=0)), "max_tokens"),
        (dict(prompt="hi", sampling=SP(stop=[""])), "stop"),
        (dict(chat=chat(Msg(role="user"))), "messages[0].content"),
        (dict(chat=chat(Msg(role="system", content="x"), Msg(role="user"))),
         "messages[1].content"),
        (dict(chat=chat(Msg(role="robot", content="x"))), "messages[0].role"),
        (dict(prompt="hi", tools=[pb.inference.Tool(name="f")]), "tools"),
        (dict(chat=chat(Msg(role="user", content="x")),
              tool_choice=pb.inference.ToolChoice(mode=pb.inference.ToolChoice.MODE_REQUIRED)),
         "tool_choice"),
        (dict(chat=chat(Msg(role="user", content="x"), Msg(role="tool", content="4"))),
         "tool_call_id"),
    ]
    for fields, word in cases:
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(pb.inference.GenerateRequest(**fields), timeout=30))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (fields, error.value)
        assert word in error.value.details(), (fields, error.value.details())


# ------------------------------------------------------------------------------------------------
# 2. Log-probabilities, through the openai SDK, against llama.cpp.
# ------------------------------------------------------------------------------------------------

LONG_PROMPT = ("The history of the Roman Empire spans more than a thousand years, from the "
               "founding of the city to the fall of Constantinople. Its institutions")  # remote


def reference_logprobs(llm, prompt_ids, generated_ids):
    """llama.cpp's log_softmax rows predicting each generated token."""
    llm.reset()
    llm.eval(list(prompt_ids) + list(generated_ids))
    n = len(prompt_ids)
    logits = np.array(llm.scores[n - 1: n - 1 + len(generated_ids)], dtype=np.float64)
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def piece(llm, token_id):
    return llm.detokenize([token_id], special=True).decode("utf-8", "replace")


def check_against_reference(llm, prompt_ids, tokens, logprobs, tops):
    """`tokens` (strings), `logprobs` and `tops` ({string: logprob} per position) of a greedy
    answer against llama.cpp's on the same tokens."""
    # The generated ids: at each position the greedy choice is the most likely alternative.
    ids = [llm.tokenize(t.encode(), add_bos=False, special=True) for t in tokens]
    generated = [i[0] if len(i) == 1 else None for i in ids]
    ref = None
    diffs = []
    for pos, (token, logprob, top) in enumerate(zip(tokens, logprobs, tops)):
        # Our top alternatives are sorted, the sampled (greedy) token first.
        assert max(top.values()) == pytest.approx(logprob, abs=1e-6), (pos, token, top)
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-4
    known = [g for g in generated if g is not None]
    if len(known) < len(generated):  # a token whose string re-tokenizes differently: stop there
        generated = generated[: generated.index(None)]
    ref = reference_logprobs(llm, prompt_ids, generated)
    for pos, token_id in enumerate(generated):
        diffs.append(abs(ref[pos][token_id] - logprobs[pos]))
        for alt, value in tops[pos].items():
            alt_ids = llm.tokenize(alt.encode(), add_bos=False, special=True)
            if len(alt_ids) == 1:
                diffs.append(abs(ref[pos][alt_ids[0]] - value))
        order = np.argsort(-ref[pos])
        if ref[pos][order[0]] - ref[pos][order[1]] >= NEAR_TIE:
            assert order[0] == token_id, (pos, piece(llm, order[0]), tokens[pos])
    assert len(generated) >= 4 and np.mean(diffs) < MAX_MEAN_DIFF, (len(generated), np.mean(diffs))


def prompt_ids(cluster, **body):
    status, reply = http_request(cluster.http_port, "POST", "/tokenize", body)
    assert status == 200, reply
    return reply["tokens"]


@pytest.mark.parametrize("prompt", ["The capital of France is", LONG_PROMPT])
def test_completions_logprobs_match_llama_cpp_streaming_and_not(cluster, client, llm, prompt):
    kw = dict(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=5)
    done = client.completions.create(**kw)
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    assert all(len(top) == 5 for top in lp.top_logprobs)
    assert "".join(lp.tokens) == done.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]
    check_against_reference(llm, prompt_ids(cluster, prompt=prompt), lp.tokens, lp.token_logprobs,
                            lp.top_logprobs)
    # Streamed: the same tokens and values, chunk by chunk.
    tokens, values, offsets = [], [], []
    for chunk in client.completions.create(**kw, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
            values += chunk.choices[0].logprobs.token_logprobs
            offsets += chunk.choices[0].logprobs.text_offset
    assert tokens == lp.tokens and offsets == lp.text_offset
    assert values == pytest.approx(lp.token_logprobs, abs=1e-5)


def test_chat_logprobs_match_llama_cpp_streaming_and_not(cluster, client, llm):
    messages = [{"role": "user", "content": "Name three colours."}]
    kw = dict(model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True,
              top_logprobs=3)
    done = client.chat.completions.create(**kw)
    content = done.choices[0].logprobs.content
    assert len(content) == 8 and all(len(t.top_logprobs) == 3 for t in content)
    assert all(bytes(t.bytes).decode("utf-8", "replace") == t.token for t in content)
    check_against_reference(llm, prompt_ids(cluster, messages=messages),
                            [t.token for t in content], [t.logprob for t in content],
                            [{a.token: a.logprob for a in t.top_logprobs} for t in content])
    streamed = []
    for chunk in client.chat.completions.create(**kw, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-5)
    # Without logprobs there are none.
    assert client.chat.completions.create(model=MODEL, messages=messages,
                                          max_tokens=2).choices[0].logprobs is None


# ------------------------------------------------------------------------------------------------
# 3. n, best_of, stop arrays.
# ------------------------------------------------------------------------------------------------

def test_n_and_best_of(cluster, client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=11)
    three = client.completions.create(**kw, n=3, logprobs=0)
    assert sorted(ch.index for ch in three.choices) == [0, 1, 2]
    texts = [ch.text for ch in sorted(three.choices, key=lambda ch: ch.index)]
    assert len(set(texts)) == 3, texts  # distinct seeds, distinct stories
    assert three.usage.completion_tokens == sum(len(ch.logprobs.tokens) for ch in three.choices)
    # The same seed gives the same three again; best_of=3 returns the most likely of them.
    cumulative = {ch.text: sum(ch.logprobs.token_logprobs) for ch in three.choices}
    best = client.completions.create(**kw, n=1, best_of=3)
    assert len(best.choices) == 1
    assert best.choices[0].text == max(cumulative, key=cumulative.get), cumulative
    assert best.usage.completion_tokens == three.usage.completion_tokens  # all 3 generated
    # Streamed: interleaved chunks by index, the same texts.
    streamed = {}
    for chunk in client.completions.create(**kw, n=3, stream=True):
        for ch in chunk.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + ch.text
    assert [streamed[i] for i in range(3)] == texts
    # Chat too.
    chat = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, n=2, seed=3,
                                          temperature=1.0)
    assert sorted(ch.index for ch in chat.choices) == [0, 1]


def test_stop_arrays(client):
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=24, temperature=0)
    free = client.completions.create(**kw).choices[0].text
    words = free.split()
    assert len(words) >= 4, free
    stops = [words[3], words[2]]  # whichever comes first ends it
    stopped = client.completions.create(**kw, stop=stops).choices[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free[: min(free.index(s) for s in stops)], (free, stops, stopped.text)


# ------------------------------------------------------------------------------------------------
# 4. /tokenize, /detokenize, cached_tokens.
# ------------------------------------------------------------------------------------------------

def test_tokenize_and_detokenize_agree_with_llama_cpp(cluster, llm):
    text = "Tokenizers split text: naïve café, 3.14159, and <|im_start|> too."
    got = http_request(cluster.http_port, "POST", "/tokenize", {"prompt": text})[1]
    assert got["tokens"] == llm.tokenize(text.encode(), add_bos=True, special=True)
    assert got["count"] == len(got["tokens"]) and got["max_model_len"] == 8192
    bare = http_request(cluster.http_port, "POST", "/tokenize",
                        {"prompt": text, "add_special_tokens": False})[1]
    assert bare["tokens"] == llm.tokenize(text.encode(), add_bos=False, special=True)
    back = http_request(cluster.http_port, "POST", "/detokenize", {"tokens": bare["tokens"]})[1]
    assert back["prompt"] == llm.detokenize(bare["tokens"], special=True).decode() == text
    # A chat: its template's tokens, with or without the assistant's generation prompt.
    with_prompt = prompt_ids(cluster, messages=USER)
    without = prompt_ids(cluster, messages=USER, add_generation_prompt=False)
    assert len(with_prompt) > len(without) and with_prompt[: len(without)] == without
    header = llm.tokenize(b"<|im_start|>assistant\n", add_bos=False, special=True)
    assert with_prompt[len(without):] == header


def test_cached_tokens_on_a_repeated_long_prompt(client):
    prompt = LONG_PROMPT + " were copied across the Mediterranean world for centuries." * 4
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens == again.usage.prompt_tokens > 48
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens, again.usage
