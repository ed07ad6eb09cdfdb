"""Completions' `echo` with prompt log-probabilities (docs/api.md), as evaluation harnesses score
text (lm-evaluation-harness's local-completions loglikelihood): through the openai SDK against a
real router + prefill + decode cluster, the prompt tokens' log-probabilities compared with
llama.cpp's on the same token ids."""

import sys
from pathlib import Path

import numpy as np
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from cluster_common import Cluster, http_request, wait_until  # noqa: E402
from reference_common import DEFAULT_MODEL, NEAR_TIE  # noqa: E402

import llama_cpp  # noqa: E402  -- installed by scripts/setup.sh

# As openai_catalogue_test's logprob check: the two engines differ by quantization noise on this
# Q4_1 model.
MAX_MEAN_DIFF = 0.35
MODEL = "SmolLM2-135M-Instruct.Q4_1"
SHORT = "The capital of France is Paris, and the capital of Italy is"
# Over the router's --local_prefill_threshold=16: a prompt the cluster would prefill remotely.
LONG = ("The history of the Roman Empire spans more than a thousand years, from the founding of "
        "the city to the fall of Constantinople. Its institutions")


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(prefill=1, decode=1, tag="echo-")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.http_port}/v1", api_key="unused",
                         max_retries=0)


@pytest.fixture(scope="module")
def llm():
    return llama_cpp.Llama(model_path=str(DEFAULT_MODEL), n_ctx=512, n_batch=512, logits_all=True,
                           n_threads=2, verbose=False, seed=0)


def prompt_ids(cluster, prompt):
    status, reply = http_request(cluster.http_port, "POST", "/tokenize", {"prompt": prompt})
    assert status == 200, reply
    return reply["tokens"]


def reference_rows(llm, ids):
    """llama.cpp's log_softmax after each of `ids` (row i predicts ids[i + 1])."""
    llm.reset()
    llm.eval(list(ids))
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def piece(llm, token_id):
    return llm.detokenize([token_id], special=True).decode("utf-8", "replace")


def check_prompt_logprobs(llm, ids, lp, top_n):
    """The first len(ids) entries of `lp` (an echoed choice's logprobs) against llama.cpp."""
    n = len(ids)
    assert lp.tokens[:n] == [piece(llm, i) for i in ids]
    # The first token has no context: null, as OpenAI's API and vLLM.
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ref = reference_rows(llm, ids)
    diffs = []
    for p in range(1, n):
        value, top = lp.token_logprobs[p], lp.top_logprobs[p]
        assert value <= 0 and 1 <= len(top) <= top_n, (p, value, top)
        assert max(top.values()) >= value - 1e-6, (p, value, top)
        row = ref[p - 1]
        diffs.append(abs(row[ids[p]] - value))
        for alt, alt_value in top.items():
            alt_ids = llm.tokenize(alt.encode(), add_bos=False, special=True)
            if len(alt_ids) == 1:
                diffs.append(abs(row[alt_ids[0]] - alt_value))
        order = np.argsort(-row)
        if row[order[0]] - row[order[1]] >= NEAR_TIE:  # the most likely token agrees
            assert max(top, key=top.get) == piece(llm, order[0]), (p, top, piece(llm, order[0]))
    assert np.mean(diffs) < MAX_MEAN_DIFF, np.mean(diffs)


@pytest.mark.parametrize("prompt", [SHORT, LONG])
def test_echo_scores_the_prompt_like_llama_cpp(cluster, client, llm, prompt):
    ids = prompt_ids(cluster, prompt)
    done = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=5,
                                     max_tokens=0)
    choice = done.choices[0]
    assert choice.text == prompt
    assert choice.finish_reason == "length"
    assert done.usage.prompt_tokens == len(ids) and done.usage.completion_tokens == 0
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids)
    # Offsets into the returned text, each token's text found there.
    assert "".join(lp.tokens) == prompt
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]
    for token, offset in zip(lp.tokens, lp.text_offset):
        assert prompt[offset: offset + len(token)] == token
    check_prompt_logprobs(llm, ids, lp, 5)
    # Scored on the decode worker itself, even when long enough for a remote prefill.
    rid = done.id.removeprefix("cmpl-")
    wait_until(lambda: any(f"request {rid}: started" in l and "prefill here" in l
                           for l in cluster.decode[0].log), what="the decode worker's start line")
    # Again: the prefix cache now holds the prompt's blocks, which scoring does not reuse.
    again = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=5,
                                      max_tokens=0)
    assert again.choices[0].logprobs.tokens == lp.tokens
    assert again.choices[0].logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:],
                                                                         abs=1e-4)


def test_echo_with_generated_tokens_streaming_and_not(cluster, client, llm):
    kw = dict(model=MODEL, prompt=SHORT, echo=True, logprobs=3, max_tokens=4, temperature=0)
    done = client.completions.create(**kw)
    choice = done.choices[0]
    plain = client.completions.create(model=MODEL, prompt=SHORT, max_tokens=4, temperature=0,
                                      logprobs=3).choices[0]
    assert choice.text == SHORT + plain.text
    ids = prompt_ids(cluster, SHORT)
    lp = choice.logprobs
    n = len(ids)
    assert len(lp.tokens) == n + len(plain.logprobs.tokens)
    check_prompt_logprobs(llm, ids, lp, 3)
    # The generated tokens' entries follow, their offsets into the whole (echoed) text.
    assert lp.tokens[n:] == plain.logprobs.tokens
    assert lp.token_logprobs[n:] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-5)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert done.usage.completion_tokens == len(plain.logprobs.tokens)
    # Streamed: the same text and entries, the prompt's in the first chunk.
    text, tokens, values, offsets = "", [], [], []
    for chunk in client.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        if not text:
            assert chunk.choices[0].text.startswith(SHORT)
        text += chunk.choices[0].text
        if chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
            values += chunk.choices[0].logprobs.token_logprobs
            offsets += chunk.choices[0].logprobs.text_offset
    assert text == choice.text and tokens == lp.tokens and offsets == lp.text_offset
    assert values[0] is None and values[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-4)


def test_echo_without_logprobs_and_max_tokens_zero_rules(cluster, client):
    done = client.completions.create(model=MODEL, prompt=SHORT, echo=True, max_tokens=2,
                                     temperature=0)
    plain = client.completions.create(model=MODEL, prompt=SHORT, max_tokens=2, temperature=0)
    assert done.choices[0].text == SHORT + plain.choices[0].text
    assert done.choices[0].logprobs is None
    # A prompt of token ids echoes its text.
    ids = prompt_ids(cluster, SHORT)
    by_ids = client.completions.create(model=MODEL, prompt=ids, echo=True, max_tokens=0)
    assert by_ids.choices[0].text == SHORT and by_ids.usage.completion_tokens == 0
    # max_tokens 0 only with echo (nothing to return otherwise).
    status, reply = http_request(cluster.http_port, "POST", "/v1/completions",
                                 {"prompt": SHORT, "max_tokens": 0})
    assert status == 400 and reply["error"]["param"] == "max_tokens", reply
    # Chat completions have no echo.
    status, reply = http_request(cluster.http_port, "POST", "/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "hi"}], "echo": True})
    assert status == 400 and reply["error"]["param"] == "echo", reply


def test_a_batch_of_prompts_answers_each_as_its_own_request(cluster, client, llm):
    """Completions' `prompt` as a list (strings and token-id lists), as the SDK and harnesses
    send batches: choices prompt by prompt (index p·n + j), each what the prompt alone gives."""
    ids = prompt_ids(cluster, LONG)
    prompts = [SHORT, ids, "Once upon a time"]
    kw = dict(model=MODEL, max_tokens=5, temperature=0)
    alone = [client.completions.create(prompt=p, **kw) for p in prompts]
    both = client.completions.create(prompt=prompts, n=2, **kw)
    assert [c.index for c in both.choices] == list(range(6))
    for p, one in enumerate(alone):
        for j in range(2):
            assert both.choices[p * 2 + j].text == one.choices[0].text, (p, j)
    assert both.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert both.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    # Streamed: every choice's chunks under its own index, the same texts.
    texts = {}
    for chunk in client.completions.create(prompt=prompts, n=2, stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: c.text for c in both.choices}
    # Echo with prompt scores, as lm-evaluation-harness batches loglikelihood requests: each
    # choice starts with its own prompt, its scores as that prompt's alone.
    scored = client.completions.create(model=MODEL, prompt=[SHORT, LONG], echo=True, logprobs=2,
                                       max_tokens=0)
    assert [c.text for c in scored.choices] == [SHORT, LONG]
    check_prompt_logprobs(llm, prompt_ids(cluster, SHORT), scored.choices[0].logprobs, 2)
    check_prompt_logprobs(llm, ids, scored.choices[1].logprobs, 2)
    # best_of picks within each prompt's candidates.
    best = client.completions.create(model=MODEL, prompt=[SHORT, "Once upon a time"], n=1,
                                     best_of=3, max_tokens=3, temperature=1, seed=5)
    assert [c.index for c in best.choices] == [0, 1]
    # A bad prompt anywhere refuses the whole request, naming it.
    status, reply = http_request(cluster.http_port, "POST", "/v1/completions",
                                 {"prompt": ["hi", [1, 2, 10 ** 9]], "max_tokens": 2})
    assert status == 400 and reply["error"]["param"] == "prompt[1]", reply
