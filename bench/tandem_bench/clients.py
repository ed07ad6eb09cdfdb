"""How requests are sent: streaming clients for the OpenAI HTTP API and tandem.v1.Inference.

Both clients measure, on this side of the wire and with one monotonic clock:
  ttft  from sending the request to the first piece of output (an SSE chunk with text, or a gRPC
        message with token ids)
  e2e   from sending the request to the end of the stream
  itl   the gaps between consecutive pieces of output; a gRPC message that carries k tokens
        counts as k gaps of (its gap / k), so tokens that arrive together share the gap
and take the output token count from the server's usage (`usage.completion_tokens`; gRPC: the
last message's Usage), falling back to counting SSE chunks with text (or gRPC token ids) when the
server sends none. A request that fails (a transport error, an error status, an error in the
stream, a timeout) is returned with ok=False and the server's message, never raised.
"""
import asyncio
import dataclasses
import json
import math
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Outcome:
    """What one request did; times in seconds, measured by this process."""
    ok: bool = False
    error: str | None = None
    status: str | None = None           # HTTP status code or gRPC status name
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list = dataclasses.field(default_factory=list)
    output_tokens: int = 0
    output_tokens_source: str = "none"  # "usage" or "chunks"
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None  # gRPC only (Usage.cached_prompt_tokens)
    finish_reason: str | None = None
    server_ttft_s: float | None = None  # gRPC only: the router's own Timings
    server_e2e_s: float | None = None
    decode_worker: str | None = None
    prefill_worker: str | None = None
    predicted_ttft_s: float | None = None  # gRPC only: the router's predictions, when it made any
    predicted_tpot_s: float | None = None
    # gRPC only: where the server says the time went (Timings: queue_us, prefill_us,
    # kv_transfer_us, decode_us), seconds.
    server_breakdown_s: dict | None = None


@dataclasses.dataclass
class ClientOptions:
    """Settings shared by both clients."""
    endpoint: str = "completions"       # "completions" (a prompt) or "chat" (messages)
    temperature: float = 0.0
    ignore_eos: bool = True             # generate exactly output_len tokens
    send_slo: bool = True               # send the request's targets (gRPC Slo; HTTP "slo")
    request_timeout_s: float = 300.0
    # PEM CA bundle that verifies the server's certificate: HTTPS for openai, TLS for gRPC
    # (`tandem up --tls` prints its CA). None: plaintext gRPC, and the system's CAs for https://.
    ca_file: str | None = None
    # Sent as `Authorization: Bearer` (gRPC: `authorization` metadata); None sends none. Kept out
    # of repr() so that it never reaches a log or a traceback.
    api_key: str | None = dataclasses.field(default=None, repr=False)


class _Stream:
    """Arrival times of output pieces; turns them into TTFT, ITLs and E2E."""

    def __init__(self):
        self.start = time.perf_counter()
        self.last = None
        self.outcome = Outcome()
        self.pieces = 0

    def piece(self, tokens=1):
        now = time.perf_counter()
        if self.last is None:
            self.outcome.ttft_s = now - self.start
        else:
            gap = (now - self.last) / max(1, tokens)
            self.outcome.itl_s.extend([gap] * max(1, tokens))
        self.last = now
        self.pieces += max(1, tokens)

    def finish(self, ok, error=None):
        self.outcome.e2e_s = time.perf_counter() - self.start
        self.outcome.ok = ok
        self.outcome.error = error
        if self.outcome.output_tokens_source == "none" and self.pieces:
            self.outcome.output_tokens = self.pieces
            self.outcome.output_tokens_source = "chunks"
        if ok and self.outcome.ttft_s is None:
            self.outcome.ok = False
            self.outcome.error = "the stream ended without any output"
        return self.outcome


# ------------------------------------------------------------------------------------------------
# OpenAI HTTP.
# ------------------------------------------------------------------------------------------------


def openai_base(url):
    """http://host:port or http://host:port/v1 (trailing slash or not) as http://host:port/v1."""
    url = url.rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


def openai_body(spec, options):
    """The JSON body of one streaming request."""
    body = {"max_tokens": spec.output_len, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": options.temperature}
    if spec.model:
        body["model"] = spec.model
    if options.endpoint == "chat":
        messages = []
        if spec.system:
            messages.append({"role": "system", "content": spec.system})
        messages.append({"role": "user", "content": spec.user})
        body["messages"] = messages
    else:
        body["prompt"] = spec.prompt
    if options.ignore_eos:
        body["ignore_eos"] = True   # Tandem, vLLM and SGLang accept it; OpenAI ignores it
    if spec.priority:
        body["priority"] = spec.priority
    if options.send_slo:
        slo = {k: v for k, v in (("ttft_ms", spec.ttft_slo_ms), ("tpot_ms", spec.tpot_slo_ms)) if v}
        if slo:
            body["slo"] = slo   # Tandem's {"ttft_ms", "tpot_ms"}; other servers ignore it
    return body


def _error_text(payload):
    """The message of an OpenAI error body, or the text itself."""
    try:
        data = json.loads(payload)
        error = data.get("error", data)
        if isinstance(error, dict):
            code = error.get("code")
            message = error.get("message", json.dumps(error))
            return f"{code}: {message}" if code else str(message)
        return str(error)
    except (ValueError, AttributeError):
        return payload.strip()[:500] or "(empty body)"


class OpenAIClient:
    """Streams /v1/completions or /v1/chat/completions with server-sent events."""

    def __init__(self, url, options, max_connections=None):
        import httpx2
        self._httpx = httpx2
        self.base = openai_base(url)
        self.options = options
        self.path = "/chat/completions" if options.endpoint == "chat" else "/completions"
        verify = True
        if options.ca_file:
            import ssl
            verify = ssl.create_default_context(cafile=options.ca_file)
        self._client = httpx2.AsyncClient(
            verify=verify,
            timeout=httpx2.Timeout(options.request_timeout_s, connect=30.0),
            limits=httpx2.Limits(max_connections=max_connections, max_keepalive_connections=None))

    async def close(self):
        await self._client.aclose()

    async def connect(self, timeout_s=30.0):
        """Connections are opened by the first requests (cheap on HTTP/1.1); nothing to wait for."""

    async def send(self, spec, request_id):
        body = openai_body(spec, self.options)
        stream = _Stream()
        headers = {"X-Request-Id": request_id}
        if self.options.api_key:
            headers["Authorization"] = f"Bearer {self.options.api_key}"
        try:
            async with asyncio.timeout(self.options.request_timeout_s):
                return await self._send(body, headers, stream)
        except TimeoutError:
            return stream.finish(False, f"timed out after {self.options.request_timeout_s} s")
        except self._httpx.HTTPError as error:
            return stream.finish(False, f"{type(error).__name__}: {error}")
        except OSError as error:
            return stream.finish(False, f"{type(error).__name__}: {error}")

    async def _send(self, body, headers, stream):
        outcome = stream.outcome
        async with self._client.stream("POST", self.base + self.path, json=body,
                                       headers=headers) as response:
            outcome.status = str(response.status_code)
            if response.status_code != 200:
                payload = (await response.aread()).decode("utf-8", "replace")
                return stream.finish(False, f"HTTP {response.status_code}: {_error_text(payload)}")
            done = False
            async for line in response.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    return stream.finish(False, f"a stream chunk is not JSON: {data[:200]}")
                if "error" in chunk:
                    return stream.finish(False, _error_text(data))
                for choice in chunk.get("choices") or []:
                    text = choice.get("text")
                    if text is None:
                        text = (choice.get("delta") or {}).get("content")
                    if text:
                        stream.piece()
                    if choice.get("finish_reason"):
                        outcome.finish_reason = choice["finish_reason"]
                usage = chunk.get("usage")
                if usage:
                    if usage.get("completion_tokens") is not None:
                        outcome.output_tokens = int(usage["completion_tokens"])
                        outcome.output_tokens_source = "usage"
                    if usage.get("prompt_tokens") is not None:
                        outcome.prompt_tokens = int(usage["prompt_tokens"])
                    details = usage.get("prompt_tokens_details") or {}
                    if details.get("cached_tokens") is not None:
                        outcome.cached_prompt_tokens = int(details["cached_tokens"])
            if not done:
                return stream.finish(False, "the stream ended before data: [DONE]")
            if outcome.finish_reason == "error":
                return stream.finish(False, "the server ended the stream with finish_reason error")
            return stream.finish(True)


# ------------------------------------------------------------------------------------------------
# gRPC: tandem.v1.Inference/Generate.
# ------------------------------------------------------------------------------------------------

_PROTOS = None


def protos():
    """The tandem.v1 Python modules, generated from <repo>/proto once per process."""
    global _PROTOS
    if _PROTOS is None:
        sys.path.insert(0, str(ROOT / "tests" / "proto_interop"))
        try:
            from generated_protos import GeneratedProtos
        finally:
            sys.path.remove(str(ROOT / "tests" / "proto_interop"))
        _PROTOS = GeneratedProtos(ROOT / "proto")
    return _PROTOS


def grpc_target(url):
    """host:port from host:port, grpc://host:port or http://host:port."""
    for scheme in ("grpc://", "http://", "https://", "dns:///"):
        if url.startswith(scheme):
            url = url[len(scheme):]
    return url.rstrip("/")


def grpc_request(spec, options, request_id):
    """The GenerateRequest of one spec."""
    p = protos().inference
    request = p.GenerateRequest(request_id=request_id, model=spec.model or "",
                                priority=spec.priority)
    if options.endpoint == "chat":
        if spec.system:
            request.chat.messages.add(role="system", content=spec.system)
        request.chat.messages.add(role="user", content=spec.user)
    else:
        request.prompt = spec.prompt
    request.sampling.max_tokens = spec.output_len
    request.sampling.temperature = options.temperature
    request.sampling.ignore_eos = options.ignore_eos
    if options.send_slo:
        # Whole milliseconds, rounded up: the objective sent is never tighter than the one measured.
        if spec.ttft_slo_ms:
            request.slo.ttft_ms = math.ceil(spec.ttft_slo_ms)
        if spec.tpot_slo_ms:
            request.slo.tpot_ms = math.ceil(spec.tpot_slo_ms)
    return request


class GrpcClient:
    """Streams tandem.v1.Inference/Generate with grpc.aio."""

    def __init__(self, url, options):
        import grpc
        self._grpc = grpc
        self.target = grpc_target(url)
        self.options = options
        channel_options = [("grpc.max_receive_message_length", 64 << 20)]
        if options.ca_file:
            with open(options.ca_file, "rb") as f:
                credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
            self._channel = grpc.aio.secure_channel(self.target, credentials, channel_options)
        else:
            self._channel = grpc.aio.insecure_channel(self.target, options=channel_options)
        self._metadata = (("authorization", f"Bearer {options.api_key}"),) \
            if options.api_key else None
        self._stub = protos().inference_grpc.InferenceStub(self._channel)
        self._finish_names = {v.number: v.name.removeprefix("FINISH_REASON_").lower()
                              for v in protos().inference.FinishReason.DESCRIPTOR.values}

    async def close(self):
        await self._channel.close()

    async def connect(self, timeout_s=30.0):
        """Waits until the channel is connected, so that the first request's TTFT does not
        include connection set-up; raises ConnectionError after `timeout_s`."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout_s)
        except asyncio.TimeoutError:
            raise ConnectionError(f"no gRPC connection to {self.target} within {timeout_s:g} s") from None

    async def send(self, spec, request_id):
        request = grpc_request(spec, self.options, request_id)
        stream = _Stream()
        outcome = stream.outcome
        try:
            call = self._stub.Generate(request, timeout=self.options.request_timeout_s,
                                       metadata=self._metadata)
            async for response in call:
                if response.token_ids:
                    stream.piece(len(response.token_ids))
                if response.finish_reason:
                    outcome.finish_reason = self._finish_names.get(response.finish_reason,
                                                                   str(response.finish_reason))
                if response.HasField("usage"):
                    outcome.output_tokens = response.usage.completion_tokens
                    outcome.output_tokens_source = "usage"
                    outcome.prompt_tokens = response.usage.prompt_tokens
                    outcome.cached_prompt_tokens = response.usage.cached_prompt_tokens
                if response.HasField("timings"):
                    t = response.timings
                    outcome.server_ttft_s = t.ttft_us / 1e6 if t.ttft_us else None
                    outcome.server_e2e_s = t.e2e_us / 1e6 if t.e2e_us else None
                    outcome.decode_worker = t.decode_worker or None
                    outcome.prefill_worker = t.prefill_worker or None
                    # Fields of newer protos; 0 (or absent) when the policy predicts nothing.
                    outcome.predicted_ttft_s = getattr(t, "predicted_ttft_us", 0) / 1e6 or None
                    outcome.predicted_tpot_s = getattr(t, "predicted_tpot_us", 0) / 1e6 or None
                    outcome.server_breakdown_s = {
                        name: getattr(t, f"{name}_us", 0) / 1e6
                        for name in ("queue", "prefill", "kv_transfer", "decode")}
                if response.error_message:
                    outcome.status = "OK"
                    return stream.finish(False, f"stream error: {response.error_message}")
            outcome.status = "OK"
        except self._grpc.aio.AioRpcError as error:
            outcome.status = error.code().name
            return stream.finish(False, f"{error.code().name}: {error.details()}")
        except (OSError, asyncio.TimeoutError) as error:
            return stream.finish(False, f"{type(error).__name__}: {error}")
        if outcome.finish_reason in ("error", "cancelled"):
            return stream.finish(False, f"the server ended the stream: {outcome.finish_reason}")
        return stream.finish(True)


def make_client(protocol, url, options, max_connections=None):
    if protocol == "grpc":
        return GrpcClient(url, options)
    return OpenAIClient(url, options, max_connections=max_connections)
