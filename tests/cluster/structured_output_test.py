"""Structured output (response_format) end to end: the official `openai` SDK against a router in
front of a prefill and a decode worker on the default model. Grammar-constrained decoding makes
every output valid whatever the model would have said: JSON outputs are checked with Python's
json module and PyPI `jsonschema`, Pydantic models through the SDK's own parse(); a schema that
does not compile is a 400. Chat prompts here are longer than the router's local-prefill threshold,
so the first token is sampled (under the grammar) on the prefill worker and the rest on the
decode worker; short completions prompts stay on the decode worker."""
import json
import typing

import grpc
import jsonschema
import openai
import pydantic
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from cluster_common import Cluster, Protos

MAX_TOKENS = 160


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(prefill=1, decode=1, policy="kv_aware", tag="so-")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.http_port}/v1", api_key="unused",
                         max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    country: str = pydantic.Field(max_length=24)
    # Bounded: left unbounded, this small model's greedy choice repeats digits until max_tokens.
    population: int = pydantic.Field(ge=0, le=100_000_000)
    coastal: bool


class Landmark(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    kind: typing.Literal["bridge", "tower", "church", "museum"]


class Trip(pydantic.BaseModel):
    # A nested model (the SDK's schema refers to it through $defs / $ref) in a bounded list.
    city: City
    landmarks: list[Landmark] = pydantic.Field(min_length=1, max_length=3)


def test_nested_pydantic_models_through_the_sdks_parse(client, model_id):
    completion = client.chat.completions.parse(
        model=model_id, response_format=Trip, max_tokens=2 * MAX_TOKENS, temperature=0.7, seed=5,
        messages=[{"role": "user", "content": "Plan a trip to Paris as JSON."}])
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, Trip), choice.message
    assert 1 <= len(choice.message.parsed.landmarks) <= 3


def test_pydantic_model_through_the_sdks_parse(client, model_id):
    completion = client.chat.completions.parse(
        model=model_id, response_format=City, max_tokens=MAX_TOKENS, temperature=0,
        messages=[{"role": "user", "content": "Describe the city of Lisbon as JSON."}])
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, City), choice.message
    # The text is the JSON that Pydantic itself reads back to the same object.
    assert City.model_validate_json(choice.message.content) == choice.message.parsed


SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 20},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "horror"]},
                   "maxItems": 3},
        "rating": {"type": "number"},
    },
    "required": ["title", "year", "genres"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_outputs_validate_when_sampling(client, model_id, seed):
    completion = client.chat.completions.create(
        model=model_id, max_tokens=MAX_TOKENS, temperature=1.0, seed=seed,
        messages=[{"role": "user", "content": "Give me a film as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "film", "schema": SCHEMA, "strict": True}})
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_object_outputs_are_objects_chat_and_streamed(client, model_id):
    # Sampled with a seed (greedy, this small model repeats a list item until max_tokens); the
    # same seed gives the same tokens streamed.
    messages = [{"role": "user", "content": "List three colours as a JSON object."}]
    fmt = {"type": "json_object"}
    whole = client.chat.completions.create(model=model_id, messages=messages, temperature=1.0,
                                           seed=11, max_tokens=MAX_TOKENS, response_format=fmt)
    assert whole.choices[0].finish_reason == "stop", whole
    assert isinstance(json.loads(whole.choices[0].message.content), dict)
    chunks = list(client.chat.completions.create(model=model_id, messages=messages, temperature=1.0,
                                                 seed=11, max_tokens=MAX_TOKENS,
                                                 response_format=fmt, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content


def test_completions_with_a_short_prompt_decode_locally(client, model_id):
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
    completion = client.completions.create(model=model_id, prompt="A number:", max_tokens=40,
                                           temperature=0, extra_body={"response_format": fmt})
    assert completion.choices[0].finish_reason == "stop", completion
    assert isinstance(json.loads(completion.choices[0].text)["n"], int)


@pytest.mark.parametrize("response_format, message, param", [
    # Compiled on the worker, which names the field over gRPC (the router relays it).
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}},
     "json_schema", "response_format"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": "(unclosed"}}}, "json_schema", "response_format"),
    # Checked by the router.
    ({"type": "xml"}, "response_format.type", "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema", "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
     "response_format.json_schema.name", "response_format.json_schema.name"),
    ("json", "response_format", "response_format"),
])
def test_bad_response_formats_are_400_naming_the_parameter(client, model_id, response_format,
                                                           message, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=model_id, max_tokens=8,
                                       messages=[{"role": "user", "content": "Hi"}],
                                       response_format=response_format)
    assert message in str(error.value), error.value
    assert error.value.param == param, error.value


def test_a_schema_the_worker_refuses_names_the_field_over_grpc_too(cluster):
    """gRPC's rich error model, read by grpcio-status: a google.rpc.BadRequest detail whose field
    violation names the field, as the worker said it to the router."""
    pb = Protos()
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
    inf = pb.inference
    request = inf.GenerateRequest(
        prompt="Hi", sampling=inf.SamplingParams(
            max_tokens=4, response_format=inf.ResponseFormat(json_schema='{"type": "nope"}')))
    with pytest.raises(grpc.RpcError) as error:
        list(stub.Generate(request, timeout=60))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(error.value)
    assert status is not None and status.message == error.value.details()
    violations = []
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        assert detail.Unpack(bad), detail.type_url
        violations += [(v.field, v.description) for v in bad.field_violations]
    assert violations == [("response_format", error.value.details())]


def test_min_tokens_with_a_response_format_is_a_400(client, model_id):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=model_id, max_tokens=8,
                                       messages=[{"role": "user", "content": "Hi"}],
                                       response_format={"type": "json_object"},
                                       extra_body={"min_tokens": 2})
    assert "min_tokens" in str(error.value) and "response_format" in str(error.value), error.value
