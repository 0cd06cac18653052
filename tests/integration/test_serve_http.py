"""The HTTP front end of ``simserve serve`` (simserve/live/http.py) against a scripted simulation:
vLLM's chunk, response, error and metric shapes, and how a request's lengths are read."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from simserve.live.api import TTFT_BUCKETS, Histogram, ReplicaStats, TokenStream
from simserve.live.http import Frontend, count_text_tokens, prometheus_text


class ScriptedSim:
    """A LiveSimulation whose tokens come ``gap`` seconds apart, all of them; it refuses a
    request whose prompt plus output exceed 90 tokens (as a KV cache would)."""

    model_name = "fake-model"
    max_model_len = 100
    vocab_size = 1000

    def __init__(self, gap: float = 0.002, draw: int = 5):
        self.gap, self.draw = gap, draw
        self.error: BaseException | None = None
        self.submitted: list[tuple[int, int, int | None]] = []

    def submit(self, num_prompt_tokens, num_output_tokens, replica=None,
               finish_reason="length") -> TokenStream:
        self.submitted.append((num_prompt_tokens, num_output_tokens, replica))
        stream = TokenStream(len(self.submitted), num_prompt_tokens, num_output_tokens, 0.0)
        if num_prompt_tokens + num_output_tokens > 90:
            stream.end("exceeds_kv_capacity")
            return stream
        loop = asyncio.get_running_loop()
        for i in range(num_output_tokens):
            last = i == num_output_tokens - 1
            loop.call_later(self.gap * (i + 1), self._token, stream, last)
        return stream

    @staticmethod
    def _token(stream: TokenStream, last: bool) -> None:
        stream.emit(1, 0.0)
        if last:
            stream.end()

    def draw_output_tokens(self) -> int:
        return self.draw

    def stats(self):
        return [ReplicaStats(0, 3, 2, 0.25, 1, 100, 40, 7),
                ReplicaStats(1, 0, 0, 0.0, 0, 0, 0, 0)]

    def now(self) -> float:
        return 0.0


def call(sim, fn, **frontend):
    """Run ``await fn(client)`` against the front end over a real loopback socket."""
    async def main():
        client = TestClient(TestServer(Frontend(sim, **frontend).app()))
        await client.start_server()
        try:
            return await fn(client)
        finally:
            await client.close()
    return asyncio.run(main())


def sse(text: str) -> list:
    """The JSON payloads of an event stream, and "[DONE]" as itself."""
    events = [e for e in text.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events), events
    return [e[6:] if e[6:] == "[DONE]" else json.loads(e[6:]) for e in events]


async def post(client, path, body):
    resp = await client.post(path, json=body)
    return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


def test_streamed_completion_is_vllm_shaped():
    sim = ScriptedSim()
    body = {"model": "fake-model", "prompt": [5, 6, 7, 8], "max_tokens": 6, "min_tokens": 6,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}
    status, ctype, text = call(sim, lambda c: post(c, "/v1/completions", body))
    assert status == 200 and ctype.startswith("text/event-stream")
    events = sse(text)
    assert events[-1] == "[DONE]"
    usage, chunks = events[-2], events[:-2]
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 4, "total_tokens": 10, "completion_tokens": 6}
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 6
    assert all(c["object"] == "text_completion" and c["model"] == "fake-model" for c in chunks)
    assert len({c["id"] for c in events[:-1]}) == 1 and chunks[0]["id"].startswith("cmpl-")
    # the finish reason rides on the chunk with the last token, and only there
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [
        "length"]
    words = "".join(c["choices"][0]["text"] for c in chunks).split()
    ids = [i for c in chunks for i in c["choices"][0]["token_ids"]]
    assert words == [f"w{i}" for i in ids] and all(4 <= i < 1000 for i in ids)
    assert sim.submitted == [(4, 6, None)]


def test_streamed_chat_starts_with_the_role_and_ends_with_usage():
    sim = ScriptedSim()
    body = {"messages": [{"role": "user", "content": "abcd efgh"}], "max_completion_tokens": 3,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    status, _, text = call(sim, lambda c: post(c, "/v1/chat/completions", body))
    events = sse(text)
    assert status == 200 and events[-1] == "[DONE]"
    first, chunks, usage = events[0], events[1:-2], events[-2]
    assert first["object"] == "chat.completion.chunk" and first["id"].startswith("chatcmpl-")
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert len(content.split()) == 3 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    # "abcd efgh" is 9 characters: ceil(9 / 4) = 3 prompt tokens
    assert usage["usage"] == {"prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3}


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "abcd efgh", "max_tokens": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "abcd efgh"}],
                              "max_completion_tokens": 3})])
def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(path, body):
    # it was checked and then ignored: only the last chunk carried usage
    sim = ScriptedSim()
    body = {**body, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    _, _, text = call(sim, lambda c: post(c, path, body))
    events = sse(text)[:-1]
    assert all("usage" in e for e in events)
    done = [e["usage"]["completion_tokens"] for e in events]
    assert done == sorted(done) and done[-2:] == [3, 3]        # (the last: the usage chunk)
    assert all(e["usage"]["prompt_tokens"] == 3 and e["usage"]["total_tokens"] == 3 + c
               for e, c in zip(events, done))
    # without include_usage it adds nothing (vLLM's rule)
    body["stream_options"] = {"include_usage": False, "continuous_usage_stats": True}
    _, _, text = call(sim, lambda c: post(c, path, body))
    assert all("usage" not in e for e in sse(text)[:-1])


def test_without_include_usage_the_stream_ends_with_done_only():
    sim = ScriptedSim()
    body = {"prompt": "a b", "max_tokens": 2, "ignore_eos": True, "stream": True}
    _, _, text = call(sim, lambda c: post(c, "/v1/completions", body))
    events = sse(text)
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])
    assert all("token_ids" not in e["choices"][0] for e in events[:-1])


def test_whole_responses():
    sim = ScriptedSim()

    async def both(c):
        a = await c.post("/v1/completions", json={"prompt": [9] * 10, "max_tokens": 4,
                                                  "ignore_eos": True})
        b = await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 8}]}],
            "max_tokens": 2, "min_tokens": 2})
        return await a.json(), await b.json()

    a, b = call(sim, both)
    assert a["object"] == "text_completion" and len(a["choices"][0]["text"].split()) == 4
    assert a["choices"][0]["finish_reason"] == "length"
    assert a["usage"] == {"prompt_tokens": 10, "total_tokens": 14, "completion_tokens": 4}
    assert b["object"] == "chat.completion"
    assert b["choices"][0]["message"]["role"] == "assistant"
    assert len(b["choices"][0]["message"]["content"].split()) == 2
    assert b["usage"]["prompt_tokens"] == 2       # 8 characters / 4


@pytest.mark.parametrize("body, length, finish", [
    ({}, 5, "stop"),                                         # the draw (5), stops by itself
    ({"max_tokens": 3}, 3, "length"),                        # the draw capped by max_tokens
    ({"max_tokens": 10}, 5, "stop"),                         # the draw, under max_tokens
    ({"max_tokens": 10, "ignore_eos": True}, 10, "length"),  # exact
    ({"max_tokens": 10, "min_tokens": 10}, 10, "length"),    # exact
    ({"max_tokens": 10, "min_tokens": 7}, 7, "stop"),        # at least min_tokens
    ({"max_tokens": 99, "ignore_eos": True}, 90, "length"),  # clipped to the context left
])
def test_output_length(body, length, finish):
    sim = ScriptedSim(gap=0.0005, draw=5)
    full = {"prompt": [4] * 10, **body}

    async def one(c):
        return await (await c.post("/v1/completions", json=full)).json()

    out = call(sim, one)
    if length + 10 > 90:       # the scripted KV limit refuses it: but the length asked is seen
        assert out["error"]["code"] == 400
        assert sim.submitted == [(10, length, None)]
        return
    assert out["usage"]["completion_tokens"] == length
    assert out["choices"][0]["finish_reason"] == finish


@pytest.mark.parametrize("path, body, status, kind, param, starts", [
    ("/v1/completions", {"prompt": [4] * 100}, 400, "BadRequestError", "input_tokens",
     "This model's maximum context length is 100 tokens. However, your prompt contains 100 "
     "input tokens"),
    ("/v1/completions", {"prompt": [4] * 5, "max_tokens": 101}, 400, "BadRequestError",
     "max_tokens", "max_tokens=101 cannot be greater than max_model_len=100"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_completion_tokens": 500}, 400, "BadRequestError",
     "max_completion_tokens", "max_completion_tokens=500 cannot be greater"),
    ("/v1/completions", {"model": "other", "prompt": "hi"}, 404, "NotFoundError", "model",
     "The model `other` does not exist."),
    ("/v1/completions", {"prompt": ""}, 400, "BadRequestError", "prompt",
     "The prompt cannot be empty."),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "BadRequestError", "prompt", "prompt:"),
    ("/v1/completions", {"prompt": [4, 5], "n": 2}, 400, "BadRequestError", "n", "n:"),
    ("/v1/completions", {"prompt": [4, 5], "max_tokens": "3"}, 400, "BadRequestError",
     "max_tokens", "max_tokens: expected an integer"),
    ("/v1/completions", {"max_tokens": 3}, 400, "BadRequestError", "prompt", "prompt:"),
    ("/v1/chat/completions", {"messages": []}, 400, "BadRequestError", "messages",
     "messages:"),
    ("/v1/completions", {"prompt": [4] * 50, "max_tokens": 45, "ignore_eos": True}, 400,
     "BadRequestError", "input_tokens", "The request needs 95 tokens of KV cache"),
])
def test_errors_are_vllm_shaped(path, body, status, kind, param, starts):
    sim = ScriptedSim()

    async def one(c):
        resp = await c.post(path, json=body)
        return resp.status, await resp.json()

    got, out = call(sim, one)
    assert got == status
    err = out["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["param"], err["code"]) == (kind, param, status)
    assert err["message"].startswith(starts), err["message"]


def test_a_body_that_is_not_json_is_a_400():
    async def one(c):
        resp = await c.post("/v1/completions", data=b"{not json")
        return resp.status, await resp.json()

    status, out = call(ScriptedSim(), one)
    assert status == 400 and out["error"]["message"].startswith("JSON decode error")


def test_models_health_version_metrics():
    sim = ScriptedSim()

    async def all_of(c):
        out = {}
        for path in ("/v1/models", "/health", "/version", "/metrics"):
            resp = await c.get(path)
            out[path] = (resp.status, await resp.text())
        return out

    out = call(sim, all_of)
    models = json.loads(out["/v1/models"][1])
    assert models["object"] == "list" and models["data"][0]["id"] == "fake-model"
    assert models["data"][0]["max_model_len"] == 100
    assert out["/health"][0] == 200
    assert json.loads(out["/version"][1])["version"].startswith("simserve-")
    text = out["/metrics"][1]
    assert 'vllm:num_requests_running{engine="0",model_name="fake-model"} 3.0' in text
    assert 'vllm:num_requests_waiting{engine="0",model_name="fake-model"} 2.0' in text
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="fake-model"} 0.25' in text
    assert 'vllm:num_preemptions_total{engine="0",model_name="fake-model"} 1.0' in text
    assert 'vllm:generation_tokens_total{engine="1",model_name="fake-model"} 0.0' in text
    assert ('vllm:request_success_total{engine="0",finished_reason="length",'
            'model_name="fake-model"} 7.0') in text
    assert "# TYPE vllm:kv_cache_usage_perc gauge" in text


def test_one_port_per_replica_pins_requests_and_shows_its_replica():
    sim = ScriptedSim()

    async def both(c):
        await (await c.post("/v1/completions", json={"prompt": [4], "max_tokens": 1,
                                                     "ignore_eos": True})).read()
        return await (await c.get("/metrics")).text()

    text = call(sim, both, replica=1)
    assert sim.submitted == [(1, 1, 1)]
    assert 'engine="1"' in text and 'engine="0"' not in text


def test_text_prompt_estimates():
    assert count_text_tokens("abcdefgh", "chars") == 2
    assert count_text_tokens("abcdefghi", "chars") == 3
    assert count_text_tokens(" w12  w7\nw3 ", "words") == 3
    assert count_text_tokens("", "words") == 0

    sim = ScriptedSim()
    body = {"prompt": "w1 w2 w3 w4 w5", "max_tokens": 1, "ignore_eos": True}

    async def one(c):
        return await (await c.post("/v1/completions", json=body)).json()

    assert call(sim, one, text_tokens="words")["usage"]["prompt_tokens"] == 5
    assert sim.submitted[-1][0] == 5


def test_prometheus_text_escapes_the_model_name():
    text = prometheus_text('a"b', [ReplicaStats(0, 0, 0, 0.0, 0, 0, 0, 0)])
    assert 'model_name="a\\"b"' in text


def test_a_simulation_that_stopped_on_an_error_is_unhealthy():
    sim = ScriptedSim()
    sim.error = AssertionError("a bug")

    async def both(c):
        health = await c.get("/health")
        gen = await c.post("/v1/completions", json={"prompt": [4], "max_tokens": 1})
        return health.status, gen.status, await gen.json()

    health, status, body = call(sim, both)
    assert (health, status) == (500, 500)
    assert body["error"]["type"] == "InternalServerError" and not sim.submitted


def test_histograms_are_cumulative_with_vllm_names():
    counts = [0] * (len(TTFT_BUCKETS) + 1)
    counts[0], counts[3], counts[-1] = 2, 1, 1          # <= 1 ms twice, <= 20 ms, > 2560 s
    stats = ReplicaStats(0, 0, 0, 0.0, 0, 0, 0, 0,
                         ttft=Histogram(TTFT_BUCKETS, tuple(counts), 3000.5))
    text = prometheus_text("m", [stats])
    name = "vllm:time_to_first_token_seconds"
    assert f"# TYPE {name} histogram" in text
    assert f'{name}_bucket{{engine="0",model_name="m",le="0.001"}} 2.0' in text
    assert f'{name}_bucket{{engine="0",model_name="m",le="0.01"}} 2.0' in text
    assert f'{name}_bucket{{engine="0",model_name="m",le="0.02"}} 3.0' in text
    assert f'{name}_bucket{{engine="0",model_name="m",le="2560.0"}} 3.0' in text
    assert f'{name}_bucket{{engine="0",model_name="m",le="+Inf"}} 4.0' in text
    assert f'{name}_count{{engine="0",model_name="m"}} 4.0' in text
    assert f'{name}_sum{{engine="0",model_name="m"}} 3000.5' in text
    assert 'vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 0.0' in text
    assert "# TYPE vllm:e2e_request_latency_seconds histogram" in text


# -- the request body, checked as vLLM's server checks it (simserve/live/protocol.py) ---------

P = {"prompt": [4, 5], "max_tokens": 2}           # a valid completion to spoil one field of
M = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("path, body, param, starts", [
    # prompt token ids within the model card's vocabulary (ScriptedSim: 1000 ids)
    ("/v1/completions", {"prompt": [10**30]}, "prompt", "Token id an integer of 31 digits is "
                                                        "out of vocabulary"),
    ("/v1/completions", {"prompt": [4, 1000]}, "prompt", "Token id 1000 is out of vocabulary"),
    ("/v1/completions", {"prompt": [-1, 4]}, "prompt", "Token id -1 is out of vocabulary"),
    ("/v1/completions", {"prompt": [1e30]}, "prompt", "prompt: token ids must be integers"),
    ("/v1/completions", {"prompt": [[4, True]]}, "prompt", "prompt: expected a string or a list"),
    # min_tokens: at most max_tokens, or the context left when max_tokens is not given
    ("/v1/completions", {"prompt": [4], "min_tokens": 10**30}, "min_tokens",
     "min_tokens must be less than or equal to max_tokens=99 (the context left"),
    ("/v1/completions", {**P, "min_tokens": 3}, "min_tokens",
     "min_tokens must be less than or equal to max_tokens=2, got 3."),
    ("/v1/completions", {**P, "min_tokens": None}, "min_tokens", "min_tokens: expected an int"),
    ("/v1/completions", {**P, "max_tokens": 0}, "max_tokens", "max_tokens must be at least 1"),
    # sampling parameters: typed and bounded as SamplingParams bounds them
    ("/v1/completions", {**P, "temperature": "hot"}, "temperature", "temperature: expected a "
                                                                    "number, got 'hot'"),
    ("/v1/completions", {**P, "temperature": "0.5"}, "temperature", "temperature: expected a"),
    ("/v1/completions", {**P, "temperature": 2.5}, "temperature",
     "temperature must be in [0, 2], got 2.5."),
    ("/v1/completions", {**P, "temperature": -0.1}, "temperature", "temperature must be in"),
    ("/v1/chat/completions", {**M, "temperature": [1]}, "temperature", "temperature: expected"),
    ("/v1/completions", {**P, "top_p": 0}, "top_p", "top_p must be in (0, 1], got 0."),
    ("/v1/completions", {**P, "top_k": -2}, "top_k", "top_k must be 0 (disable), or at least 1"),
    ("/v1/completions", {**P, "top_k": 1.5}, "top_k", "top_k: expected an integer"),
    ("/v1/completions", {**P, "min_p": 1.5}, "min_p", "min_p must be in [0, 1]"),
    ("/v1/completions", {**P, "presence_penalty": 3}, "presence_penalty", "presence_penalty "
                                                                          "must be in [-2, 2]"),
    ("/v1/completions", {**P, "frequency_penalty": "0"}, "frequency_penalty", "frequency_pen"),
    ("/v1/completions", {**P, "repetition_penalty": 0}, "repetition_penalty",
     "repetition_penalty must be in (0, inf)"),
    ("/v1/completions", {**P, "seed": 2**63}, "seed", "seed must be in"),
    ("/v1/completions", {**P, "n": 0}, "n", "n must be at least 1, got 0."),
    ("/v1/completions", {**P, "n": "1"}, "n", "n: expected an integer"),
    ("/v1/completions", {**P, "logprobs": -3}, "logprobs", "logprobs must be non-negative"),
    ("/v1/chat/completions", {**M, "logprobs": 5}, "logprobs", "logprobs: expected true or"),
    ("/v1/completions", {**P, "stop": 3}, "stop", "stop: expected a string or a list of strings"),
    ("/v1/completions", {**P, "stop": [""]}, "stop", "stop cannot contain an empty string."),
    ("/v1/completions", {**P, "stop_token_ids": ["1"]}, "stop_token_ids", "stop_token_ids must"),
    ("/v1/completions", {**P, "logit_bias": [1]}, "logit_bias", "logit_bias: expected"),
    # flags and objects
    ("/v1/completions", {**P, "ignore_eos": [1]}, "ignore_eos", "ignore_eos: expected true or "
                                                                "false, got a list of 1 items"),
    ("/v1/completions", {**P, "ignore_eos": "yes"}, "ignore_eos", "ignore_eos: expected true"),
    ("/v1/completions", {**P, "stream": {"a": 1}}, "stream", "stream: expected true or false"),
    ("/v1/completions", {**P, "stream": True, "stream_options": 3}, "stream_options",
     "stream_options: expected an object, got 3"),
    ("/v1/completions", {**P, "stream": True, "stream_options": {"include_usage": "x"}},
     "stream_options.include_usage", "stream_options.include_usage: expected true or false"),
    ("/v1/completions", {**P, "stream_options": {"include_usage": True}}, "stream_options",
     "Stream options can only be defined when `stream=True`."),
    ("/v1/completions", {**P, "return_token_ids": 1}, "return_token_ids", "return_token_ids:"),
    ("/v1/completions", {**P, "model": 3}, "model", "model: expected a string, got 3"),
    ("/v1/completions", {**P, "user": ["x"]}, "user", "user: expected a string"),
    ("/v1/chat/completions", {"messages": [{"role": 3, "content": "hi"}]}, "messages",
     "messages[0].role: expected a string"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages",
     "messages[0].content[0]: expected a text part"),
    ("/v1/chat/completions", {**M, "max_completion_tokens": 2.0}, "max_completion_tokens",
     "max_completion_tokens: expected an integer, got 2.0"),
])
def test_bad_fields_are_refused_as_vllm_refuses_them(path, body, param, starts):
    sim = ScriptedSim()

    async def one(c):
        resp = await c.post(path, json=body)
        return resp.status, await resp.json()

    status, out = call(sim, one)
    assert status == 400, out
    assert out == {"error": {"message": out["error"]["message"], "type": "BadRequestError",
                             "param": param, "code": 400}}
    assert out["error"]["message"].startswith(starts), out["error"]["message"]
    assert len(out["error"]["message"]) < 300       # a huge value is described, not echoed
    assert not sim.submitted                        # refused before the simulation sees it


@pytest.mark.parametrize("raw, starts", [
    (b'{"prompt": [4], "max_tokens": 2, "temperature": 1e400}', "temperature must be a finite"),
    (b'{"prompt": [4], "max_tokens": 2, "top_p": NaN}', "top_p must be a finite number"),
    (b'{"prompt": [4], "max_tokens": 2, "min_p": -Infinity}', "min_p must be a finite number"),
    (b'{"prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}", "JSON decode error: nested too deeply"),
    (b'{"prompt": [4], "user": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}",
     "JSON decode error: nested too deeply"),
    (b'{"prompt": [4], "max_tokens": ' + b"9" * 5000 + b"}", "JSON decode error"),
    (b"\xff\xfe{}", "JSON decode error"),
])
def test_json_that_python_reads_oddly_is_a_400(raw, starts):
    sim = ScriptedSim()

    async def one(c):
        resp = await c.post("/v1/completions", data=raw,
                            headers={"Content-Type": "application/json"})
        return resp.status, await resp.json()

    status, out = call(sim, one)
    assert status == 400 and out["error"]["code"] == 400
    assert out["error"]["message"].startswith(starts), out["error"]["message"]
    assert not sim.submitted


def test_empty_stream_options_include_usage_as_vllm_defaults():
    # vLLM's StreamOptions: include_usage defaults to true once stream_options is given
    sim = ScriptedSim()
    body = {"prompt": "a b", "max_tokens": 2, "ignore_eos": True, "stream": True,
            "stream_options": {}}
    _, _, text = call(sim, lambda c: post(c, "/v1/completions", body))
    assert sse(text)[-2]["usage"]["completion_tokens"] == 2


async def _raw_exchange(client, head: bytes, body_chunks=(), read_first=False) -> bytes:
    """Send ``head`` (and the chunks) over a plain socket; the status line and headers back."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(head)
        await writer.drain()
        if read_first:
            return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        for chunk in body_chunks:
            writer.write(chunk)
            try:
                await writer.drain()
            except ConnectionError:
                break
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()


def test_a_body_over_the_limit_is_refused_by_its_content_length_before_it_is_sent():
    # the answer comes while the client has sent only the headers: nothing was buffered
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (65 << 20))
    got = call(ScriptedSim(), lambda c: _raw_exchange(c.server, head, read_first=True))
    assert got.startswith(b"HTTP/1.1 413 ")


def test_a_chunked_body_is_cut_off_at_the_limit(monkeypatch):
    import simserve.live.http as http
    monkeypatch.setattr(http, "MAX_BODY_BYTES", 1 << 20)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n" % (64 << 10) + b" " * (64 << 10) + b"\r\n"
    sim = ScriptedSim()
    got = call(sim, lambda c: _raw_exchange(c.server, head, [chunk] * 40))   # 2.5 MiB
    assert got.startswith(b"HTTP/1.1 413 ") and not sim.submitted


def test_chat_checks_max_tokens_beside_max_completion_tokens():
    sim = ScriptedSim()

    async def one(c):
        resp = await c.post("/v1/chat/completions", json={**M, "max_completion_tokens": 2,
                                                          "max_tokens": "x"})
        return resp.status, await resp.json()

    status, out = call(sim, one)
    assert status == 400 and out["error"]["param"] == "max_tokens" and not sim.submitted


@pytest.mark.parametrize("rest", [b"zz\r\nmore\r\n0\r\n\r\n", b""])
def test_a_body_that_stalls_or_turns_to_garbage_midway_is_dropped(monkeypatch, rest):
    # the handler is already reading when the body stops, or when a bad chunk arrives (aiohttp
    # then never ends the payload): without a limit the handler waited as long as the client
    import simserve.live.http as http
    monkeypatch.setattr(http, "BODY_IDLE_S", 0.5)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n")

    async def two_parts(c):
        reader, writer = await asyncio.open_connection(c.server.host, c.server.port)
        writer.write(head)
        await writer.drain()
        await asyncio.sleep(0.1)                 # the handler now waits for more body
        writer.write(rest)
        await writer.drain()
        got = await asyncio.wait_for(reader.readuntil(b"}}"), 10)
        writer.close()
        return got

    sim = ScriptedSim()
    got = call(sim, two_parts)
    assert got.startswith(b"HTTP/1.1 408 ") and b"RequestTimeoutError" in got, got[:300]
    assert not sim.submitted


def test_an_unknown_route_or_method_is_answered_in_the_apis_json_error_shape():
    # they were aiohttp's plain text "404: Not Found" / "405: Method Not Allowed"
    async def both(c):
        out = []
        for resp in (await c.get("/v1/nope"), await c.get("/v1/completions")):
            out.append((resp.status, resp.headers.get("Content-Type", ""), await resp.json()))
        return out

    (s1, t1, b1), (s2, t2, b2) = call(ScriptedSim(), both)
    assert (s1, b1["error"]["type"], b1["error"]["code"]) == (404, "NotFoundError", 404)
    assert b1["error"]["message"] == "No route /v1/nope" and t1.startswith("application/json")
    assert (s2, b2["error"]["type"]) == (405, "MethodNotAllowedError")
    assert b2["error"]["message"] == "Method GET is not allowed for /v1/completions (allowed: " \
                                     "POST)" and t2.startswith("application/json")

    async def allow(c):
        return (await c.get("/v1/chat/completions")).headers.get("Allow")

    assert call(ScriptedSim(), allow) == "POST"          # (RFC 9110: a 405 says what is)
