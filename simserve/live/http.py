"""An OpenAI-compatible HTTP front end in vLLM's shapes, over a :class:`LiveSimulation`.

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed as server-sent
events or whole), ``GET /v1/models``, ``GET /health``, ``GET /version`` and ``GET /metrics``
(Prometheus text with vLLM's metric names). The shapes were read from vLLM 0.32's
``vllm/entrypoints/openai/completion/serving.py`` and ``chat_completion/serving.py`` (chunk
fields, the trailing usage chunk, ``data: [DONE]``), ``vllm/entrypoints/serve/exception_handling/
error_response.py`` and ``vllm/renderers/params.py`` (error body and messages) and
``vllm/v1/metrics/loggers.py`` (metric names and the ``model_name``/``engine`` labels).

A request body is checked field by field as vLLM's server checks it before anything else
(``simserve/live/protocol.py``). What a request means to the simulation: its prompt length
(the number of token ids, or an estimate from text: ``text_tokens``) and its output length:
``max_tokens`` when ``ignore_eos`` is set or ``min_tokens >= max_tokens`` (an exact length, as
``simserve replay`` and ``vllm bench serve --ignore-eos`` ask), otherwise a draw from the
scenario's workload, at most ``max_tokens``. Output tokens carry made-up ids (``" w<id>"`` as
text, which the word-level tokenizer of the reference CPU server's tiny model, docs/fidelity.md,
reads back as that id);
only their count and timing mean anything.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from simserve.live.api import LiveSimulation, TokenStream
from simserve.live.protocol import (
    CHARS_PER_TOKEN,
    MAX_BODY_BYTES,
    GenerateRequest,
    Limits,
    RequestError,
    count_text_tokens,
    parse_json,
    read_request,
)

__all__ = ["CHARS_PER_TOKEN", "Frontend", "RequestError", "count_text_tokens",
           "prometheus_text"]

FIRST_TOKEN_ID = 4            # ids 0-3 are special tokens in the usual tokenizers
TEXT_TOKENS = ("chars", "words")
BODY_IDLE_S = 30.0            # a request body that sends nothing for this long is dropped


def error_response(e: RequestError) -> web.Response:
    body = {"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.status}}
    resp = web.json_response(body, status=e.status)
    if e.status in (408, 413):
        resp.force_close()       # the rest of the body is not read: end the connection
    return resp


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """An unknown route (404) or method (405) answered in the API's JSON error shape, as the
    handlers answer everything else (aiohttp's default is plain text)."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as e:
        allowed = ", ".join(sorted(e.allowed_methods))
        resp = error_response(RequestError(f"Method {request.method} is not allowed for "
                                           f"{request.path} (allowed: {allowed})", None, 405,
                                           "MethodNotAllowedError"))
        resp.headers["Allow"] = ",".join(sorted(e.allowed_methods))    # (RFC 9110)
        return resp
    except web.HTTPNotFound:
        return error_response(RequestError(f"No route {request.path}", None, 404,
                                           "NotFoundError"))


# --------------------------------------------------------------------------------------------
# The application


class Frontend:
    """The HTTP handlers of one port: every replica behind the scenario's router, or one replica
    (``replica``) for an external router."""

    def __init__(self, sim: LiveSimulation, *, replica: int | None = None,
                 text_tokens: str = "chars", clock: Callable[[], float] = time.time):
        if text_tokens not in TEXT_TOKENS:
            raise ValueError(f"text_tokens must be one of {TEXT_TOKENS}")
        self.sim, self.replica, self.text_tokens = sim, replica, text_tokens
        self.clock = clock
        self.created = int(clock())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_json_errors])
        app.add_routes([
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.get("/health", self.health),
            web.get("/version", self.version),
            web.get("/metrics", self.metrics),
        ])
        return app

    # -- small endpoints -------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        # 500 once the simulation has stopped on an error (as vLLM's when its engine is dead)
        return web.Response(status=500 if self.sim.error is not None else 200)

    async def version(self, request: web.Request) -> web.Response:
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("simserve")
        except PackageNotFoundError:
            v = "unknown"
        return web.json_response({"version": f"simserve-{v}"})

    async def models(self, request: web.Request) -> web.Response:
        name = self.sim.model_name
        return web.json_response({"object": "list", "data": [{
            "id": name, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": name, "parent": None, "max_model_len": self.sim.max_model_len}]})

    async def metrics(self, request: web.Request) -> web.Response:
        stats = self.sim.stats()
        if self.replica is not None:
            stats = [s for s in stats if s.index == self.replica]
        return web.Response(text=prometheus_text(self.sim.model_name, stats),
                            content_type="text/plain", charset="utf-8")

    # -- generation ------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = parse_json(await _read_body(request))
            req = read_request(body, chat, Limits(self.sim.model_name, self.sim.max_model_len,
                                                  self.sim.vocab_size), self.text_tokens)
        except RequestError as e:
            return error_response(e)
        except ConnectionError:         # the client left mid-body: nobody to answer
            return web.Response(status=400)
        if self.sim.error is not None:
            return error_response(RequestError(f"the simulation stopped: {self.sim.error!r}",
                                               None, 500, "InternalServerError"))
        output_len, finish = self._output(req)
        stream = self.sim.submit(req.prompt_len, output_len, self.replica,
                                 finish_reason=finish)
        if stream.done and stream.reject_reason:
            return error_response(RequestError(
                _rejection_message(stream, self.sim.max_model_len), "input_tokens"))
        fmt = _Format(chat, self.sim.model_name, int(self.clock()), stream.request_id,
                      self.sim.vocab_size, req.return_token_ids)
        if req.stream:
            return await self._stream(request, stream, fmt, finish, req.include_usage,
                                      req.continuous_usage)
        while await stream.take():
            pass
        if stream.taken < stream.num_output_tokens:
            return error_response(RequestError("The server is shutting down.", None, 503,
                                               "ServiceUnavailableError"))
        return web.json_response(fmt.whole(stream, finish))

    def _output(self, req: GenerateRequest) -> tuple[int, str]:
        """Output tokens and the finish reason the request will end with."""
        room = self.sim.max_model_len - req.prompt_len   # vLLM clips max_tokens to the room
        max_tokens, min_tokens = req.max_tokens, req.min_tokens
        if max_tokens is not None and (req.ignore_eos or min_tokens >= max_tokens):
            return min(max_tokens, room), "length"
        drawn = self.sim.draw_output_tokens()      # a model that stops by itself
        cap = room if max_tokens is None else min(max_tokens, room)
        drawn = max(drawn, min_tokens)
        return min(drawn, cap), "length" if drawn >= cap else "stop"

    async def _stream(self, request: web.Request, stream: TokenStream, fmt: _Format,
                      finish: str, include_usage: bool,
                      continuous: bool = False) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        try:
            await resp.prepare(request)
            prompt = stream.num_prompt_tokens if continuous else None
            if fmt.chat:
                await resp.write(fmt.role_chunk(prompt))
            while n := await stream.take():
                last = stream.taken == stream.num_output_tokens
                await resp.write(fmt.token_chunk(stream.taken - n, n, finish if last else None,
                                                 prompt))
            if stream.taken < stream.num_output_tokens:   # cut short (the server stops): a
                if request.transport is not None:        # dropped connection, never a stream
                    request.transport.close()            # that looks complete
                return resp
            if include_usage:
                await resp.write(fmt.usage_chunk(stream))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass        # the client went away; the simulated request runs on (docs/serve.md)
        return resp


async def _read_body(request: web.Request) -> bytes:
    """The body, at most MAX_BODY_BYTES: refused by its Content-Length before any of it is
    read, or (chunked) as soon as what has arrived passes the limit; never held whole."""
    too_large = RequestError(f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB",
                             None, 413, "RequestEntityTooLargeError")
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise too_large
    body = bytearray()
    try:
        while chunk := await asyncio.wait_for(request.content.readany(), BODY_IDLE_S):
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise too_large
    except HttpProcessingError as e:     # (aiohttp raises this for some bodies cut short)
        raise RequestError("malformed request body: " + " ".join(str(e.message).split())[:200]
                           ) from None
    except asyncio.TimeoutError:
        # a body that stops arriving, or turns to garbage midway (aiohttp then never ends the
        # payload: the handler would wait as long as the client keeps the connection)
        raise RequestError(f"no more of the request body arrived for {BODY_IDLE_S:g} s, or it "
                           f"is malformed", None, 408, "RequestTimeoutError") from None
    return bytes(body)


def _rejection_message(stream: TokenStream, max_model_len: int) -> str:
    total = stream.num_prompt_tokens + stream.num_output_tokens
    if stream.reject_reason == "exceeds_kv_capacity":
        return (f"The request needs {total} tokens of KV cache (prompt plus output), more than "
                f"the simulated replica's whole KV cache holds.")
    return (f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {total} tokens (prompt plus output). Please reduce the length of the "
            f"input prompt or of the output.")


class _Format:
    """The JSON of one request's chunks and whole response, in vLLM's field order."""

    def __init__(self, chat: bool, model: str, created: int, request_id: int, vocab: int,
                 token_ids: bool):
        self.chat, self.model, self.created, self.vocab = chat, model, created, vocab
        self.token_ids = token_ids
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.rid = request_id
        self.head = (f'{{"id":"{self.id}","object":"'
                     f'{"chat.completion.chunk" if chat else "text_completion"}",'
                     f'"created":{created},"model":{json.dumps(model)},"choices":[')

    def ids(self, first: int, n: int) -> list[int]:
        """Made-up output token ids: a fixed function of the request and the token's index."""
        span = max(self.vocab - FIRST_TOKEN_ID, 1)
        return [FIRST_TOKEN_ID + (self.rid * 7919 + i * 104729) % span
                for i in range(first, first + n)]

    @staticmethod
    def _running_usage(prompt: int | None, completion: int) -> str:
        """A chunk's usage so far (continuous_usage_stats: ``prompt`` given), else nothing."""
        if prompt is None:
            return ""
        return (f',"usage":{{"prompt_tokens":{prompt},"total_tokens":{prompt + completion},'
                f'"completion_tokens":{completion}}}')

    def token_chunk(self, first: int, n: int, finish: str | None,
                    prompt: int | None = None) -> bytes:
        # formatted by hand (ids are ints, the text needs no escaping): this runs once per
        # token and stream, and json.dumps was a tenth of the server's time per token
        ids = self.ids(first, n)
        text = '"' + "".join([f" w{i}" for i in ids]) + '"'
        fin = "null" if finish is None else f'"{finish}"'
        tail = f',"token_ids":[{",".join(map(str, ids))}]' if self.token_ids else ""
        if self.chat:
            choice = (f'{{"index":0,"delta":{{"content":{text}}},"logprobs":null,'
                      f'"finish_reason":{fin}{tail}}}')
        else:
            choice = (f'{{"index":0,"text":{text},"logprobs":null,"finish_reason":{fin},'
                      f'"stop_reason":null{tail}}}')
        usage = self._running_usage(prompt, first + n)
        return f"data: {self.head}{choice}]{usage}}}\n\n".encode()

    def role_chunk(self, prompt: int | None = None) -> bytes:
        return (f'data: {self.head}{{"index":0,"delta":{{"role":"assistant","content":""}},'
                f'"logprobs":null,"finish_reason":null}}]{self._running_usage(prompt, 0)}}}'
                f'\n\n').encode()

    def _usage(self, stream: TokenStream) -> dict[str, int]:
        p, c = stream.num_prompt_tokens, stream.taken
        return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c}

    def usage_chunk(self, stream: TokenStream) -> bytes:
        usage = json.dumps(self._usage(stream), separators=(",", ":"))
        return f'data: {self.head}],"usage":{usage}}}\n\n'.encode()

    def whole(self, stream: TokenStream, finish: str) -> dict[str, Any]:
        ids = self.ids(0, stream.taken)
        text = "".join(f" w{i}" for i in ids)
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant",
                                                              "content": text},
                                      "logprobs": None, "finish_reason": finish,
                                      "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}
        if self.token_ids:
            choice["token_ids"] = ids
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice],
                "usage": self._usage(stream)}


# --------------------------------------------------------------------------------------------
# /metrics


def prometheus_text(model: str, stats) -> str:
    """Prometheus exposition text with vLLM's names and labels (``model_name``, ``engine``)."""
    gauges = (("vllm:num_requests_running", "Number of requests in model execution batches.",
               lambda s: s.num_running),
              ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
               lambda s: s.num_waiting),
              ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
               lambda s: s.kv_usage))
    counters = (("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                 lambda s: s.num_preemptions),
                ("vllm:prompt_tokens", "Number of prefill tokens processed.",
                 lambda s: s.prompt_tokens),
                ("vllm:generation_tokens", "Number of generation tokens processed.",
                 lambda s: s.generation_tokens))
    name = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    lines: list[str] = []
    for metric, doc, value in gauges:
        lines += [f"# HELP {metric} {doc}", f"# TYPE {metric} gauge"]
        lines += [f'{metric}{{engine="{s.index}",model_name="{name}"}} {float(value(s))!r}'
                  for s in stats]
    for metric, doc, value in counters:
        lines += [f"# HELP {metric}_total {doc}", f"# TYPE {metric}_total counter"]
        lines += [f'{metric}_total{{engine="{s.index}",model_name="{name}"}} '
                  f'{float(value(s))!r}' for s in stats]
    histograms = (("vllm:time_to_first_token_seconds",
                   "Histogram of time to first token in seconds.", lambda s: s.ttft),
                  ("vllm:inter_token_latency_seconds",
                   "Histogram of inter-token latency in seconds.", lambda s: s.itl),
                  ("vllm:e2e_request_latency_seconds",
                   "Histogram of e2e request latency in seconds.", lambda s: s.e2el))
    for metric, doc, value in histograms:
        lines += [f"# HELP {metric} {doc}", f"# TYPE {metric} histogram"]
        for s in stats:
            h = value(s)
            labels = f'engine="{s.index}",model_name="{name}"'
            running = 0
            for bound, n in zip((*map(repr, h.bounds), "+Inf"), h.counts):
                running += n
                lines.append(f'{metric}_bucket{{{labels},le="{bound}"}} {float(running)!r}')
            lines += [f"{metric}_count{{{labels}}} {float(h.count)!r}",
                      f"{metric}_sum{{{labels}}} {float(h.total)!r}"]
    metric = "vllm:request_success_total"
    lines += [f"# HELP {metric} Count of successfully processed requests.",
              f"# TYPE {metric} counter"]
    for s in stats:     # by the finish_reason each response carried, as vLLM labels them
        by = dict(s.finished_by_reason) or {"length": s.requests_finished}
        lines += [f'{metric}{{engine="{s.index}",finished_reason="{reason}",'
                  f'model_name="{name}"}} {float(by.get(reason, 0))!r}'
                  for reason in ("length", "stop")]
    return "\n".join(lines) + "\n"
