"""The HTTP client for a live OpenAI-compatible streaming server, shared by replay and calibrate.

What it does, and nothing more: check that an endpoint is a loopback URL, probe it (reachable,
served model, engine version), build the deterministic prompt and request body of one request,
and send one streamed ``/v1/completions`` request recording every token-carrying chunk into an
:class:`Outcome`. Timing, pacing and tables belong to the callers (``replay``, ``calibrate``).
The protocol is described in :mod:`simserve.live.replay`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from simserve.errors import SimserveError

if TYPE_CHECKING:
    from simserve.workload import RequestSpec

FIRST_TOKEN_ID = 4           # ids below are special tokens in the usual tokenizers
_PROMPT_STREAM = 0x7265706C  # "repl": the prompt ids' own stream beside the workload's
WARMUP_IDS = 1 << 40         # prompt stream ids of warm-up requests


class EndpointError(SimserveError):
    """The endpoint cannot be used: not loopback, unreachable, or it refuses the warm-up."""


# --------------------------------------------------------------------------------------------
# Endpoint checks


def check_endpoint_host(endpoint: str, allow_remote: bool = False) -> str:
    """The server's root URL (no trailing slash); refuse non-HTTP URLs and non-loopback hosts.

    Only loopback targets are allowed by default (this machine's network policy): ``localhost``,
    ``127.0.0.0/8`` and ``::1``. Host names other than ``localhost`` are not resolved.
    The client adds the routes itself (``/health``, ``/v1/models``, ``/v1/completions``), so
    the URL is the server's root; an OpenAI client's base URL (the root + ``/v1``) means the
    same server and is read as its root. Any other path is kept as the root's (a server
    behind a reverse proxy at ``http://gw/llama``), but one that ends in a route the client
    adds (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``) is
    refused: the routes under it would be 404s.
    """
    parts = urlsplit(endpoint)
    try:
        port = parts.port              # out of range or not a number: ValueError
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 \
            or any(c.isspace() for c in parts.netloc):
        raise EndpointError(f"--endpoint: expected http://HOST:PORT, got {endpoint!r}")
    host = parts.hostname
    if not allow_remote and not is_loopback(host):
        raise EndpointError(f"--endpoint: {host} is not a loopback address; only 127.0.0.1, "
                            f"localhost or ::1 are replayed against unless --allow-remote is "
                            f"given")
    path = parts.path.rstrip("/")
    if path.endswith(_ROUTES) or parts.query or parts.fragment:
        raise EndpointError(f"--endpoint: expected the server's root URL http://HOST:PORT "
                            f"(the routes /v1/models and /v1/completions are added to it), "
                            f"got {endpoint!r}")
    if path.endswith("/v1"):           # an OpenAI client's base URL: the root + /v1
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


# the routes the client adds to the root (an endpoint ending in one is a route, not a root)
_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/version")


MAX_WARMUP = 1000           # warm-up requests: a few are enough; 10^9 of them never end


def check_client_options(timeout: float, warmup: int) -> None:
    """The per-request ``timeout`` (seconds, > 0 and finite: aiohttp cannot arm an infinite
    one, and a negative or NaN one made every request fail at once) and the number of
    ``warmup`` requests (0 to MAX_WARMUP), named as the command-line options."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0 < timeout < math.inf:
        raise SimserveError(f"--timeout: must be > 0 and finite, got {timeout!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup <= MAX_WARMUP:
        raise SimserveError(f"--warmup: must be 0 to {MAX_WARMUP}, got {warmup!r}")


def is_loopback(host: str) -> bool:
    """``localhost``, ``127.0.0.0/8`` or ``::1`` (names other than localhost are not resolved)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def probe(session, endpoint: str, timeout: float) -> dict[str, Any]:
    """Reachability (any HTTP answer counts), the served model and the engine version."""
    import aiohttp
    info: dict[str, Any] = {"model": None, "engine_version": None}
    to = aiohttp.ClientTimeout(total=timeout)
    try:
        async with session.get(f"{endpoint}/health", timeout=to) as resp:
            await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise EndpointError(f"{endpoint}: unreachable ({_describe(e, timeout)}); is the server "
                            f"running?") from None
    for path, key in (("/v1/models", "model"), ("/version", "engine_version")):
        try:
            async with session.get(endpoint + path, timeout=to) as resp:
                if resp.status != 200:
                    info.setdefault("answers", {})[path] = f"HTTP {resp.status}"
                    continue
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            info.setdefault("answers", {})[path] = _describe(e, timeout)
            continue
        if key == "model" and isinstance(body, dict) and isinstance(body.get("data"), list) \
                and body["data"] and isinstance(body["data"][0], dict):
            model = body["data"][0].get("id")
            info["model"] = model if isinstance(model, str) else None
        elif key == "engine_version" and isinstance(body, dict):
            version = body.get("version")
            info["engine_version"] = version if isinstance(version, str) else None
    return info


def no_model(endpoint: str, info: dict[str, Any]) -> EndpointError:
    """The error when no model was given and ``GET /v1/models`` named none, with its answer."""
    answer = info.get("answers", {}).get("/v1/models")
    why = f"answered {answer}" if answer else "names no model"
    return EndpointError(f"{endpoint}: GET /v1/models {why}; pass --model NAME")


def _describe(e: BaseException, timeout: float | None = None) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return f"timeout after {timeout:g} s" if timeout else "timeout"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# --------------------------------------------------------------------------------------------
# Prompts


def prompt_ids(seed: int, request_id: int, length: int, vocab: int) -> list[int]:
    """``length`` random token ids in [4, vocab), from the request's own seeded stream."""
    import numpy as np
    rng = np.random.default_rng([seed, _PROMPT_STREAM, request_id])
    return rng.integers(FIRST_TOKEN_ID, vocab, size=length).tolist()


def request_body(model: str, prompt: list[int], num_output_tokens: int) -> dict[str, Any]:
    return {
        "model": model, "prompt": prompt,
        "max_tokens": num_output_tokens, "min_tokens": num_output_tokens, "ignore_eos": True,
        "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }


# --------------------------------------------------------------------------------------------
# One request


@dataclass
class Outcome:
    """What one request saw. Times are seconds since the replay's start."""

    spec: RequestSpec
    sent_s: float = math.nan
    chunk_times: list[float] = field(default_factory=list)   # chunks carrying >= 1 token
    chunk_tokens: list[int] = field(default_factory=list)
    usage_output_tokens: int | None = None
    cached_tokens: int = 0
    http_status: int | None = None
    error: str = ""

    @property
    def num_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def ok(self) -> bool:
        return not self.error and self.num_tokens > 0


def _chunk_token_count(choice: Any) -> int | None:
    """Tokens carried by one streamed choice: its token ids, or one per non-empty text (or,
    for a chat chunk, per non-empty ``delta.content``); None if the choice is not shaped as
    an OpenAI completion choice."""
    if not isinstance(choice, dict):
        return None
    ids = choice.get("token_ids")
    if ids is not None:
        return len(ids) if isinstance(ids, list) else None
    delta = choice.get("delta")
    text = choice.get("text", delta.get("content") if isinstance(delta, dict) else None)
    return 1 if text else 0


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _stream_message(data: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """One ``data:`` payload of a stream: the message, or why it cannot be read (not JSON, or
    JSON of another shape than an OpenAI stream chunk: a mapping, ``choices`` a list, ``usage``
    a mapping)."""
    try:
        msg = json.loads(data)
    except ValueError:
        return None, f"bad stream chunk: {data[:80]!r}"
    if not isinstance(msg, dict):
        return None, f"bad stream chunk (not a JSON object): {data[:80]!r}"
    if not isinstance(msg.get("choices", []), (list, type(None))) or \
            not isinstance(msg.get("usage"), (dict, type(None))):
        return None, f"bad stream chunk (choices or usage of the wrong type): {data[:80]!r}"
    return msg, None


async def send(session, url: str, body: dict[str, Any], out: Outcome, t0: float,
               timeout: float) -> None:
    """POST ``body`` to ``url`` and stream the answer into ``out`` (times since ``t0`` on
    ``time.perf_counter``). Never raises for a failed request: the error is ``out.error``."""
    import aiohttp
    out.sent_s = time.perf_counter() - t0
    try:
        async with session.post(url, json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            out.http_status = resp.status
            if resp.status != 200:
                text = (await resp.text())[:200].replace("\n", " ").strip()
                out.error = f"HTTP {resp.status}" + (f": {text}" if text else "")
                return
            async for raw in resp.content:
                now = time.perf_counter() - t0
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                msg, problem = _stream_message(data)
                if msg is None:
                    out.error = problem
                    return
                if "error" in msg and not msg.get("choices"):
                    err = msg["error"]
                    out.error = "stream error: " + str(
                        err.get("message", err) if isinstance(err, dict) else err)[:200]
                    return
                for choice in msg.get("choices") or ():
                    n = _chunk_token_count(choice)
                    if n is None:
                        out.error = f"bad stream chunk (a choice of the wrong shape): " \
                                    f"{data[:80]!r}"
                        return
                    if n:
                        out.chunk_times.append(now)
                        out.chunk_tokens.append(n)
                usage = msg.get("usage")
                if usage:
                    completion = usage.get("completion_tokens")
                    details = usage.get("prompt_tokens_details")
                    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
                    if not (completion is None or _is_count(completion)) or \
                            not (cached is None or _is_count(cached)):
                        out.error = f"bad stream chunk (usage counts not integers): " \
                                    f"{data[:80]!r}"
                        return
                    out.usage_output_tokens = completion
                    out.cached_tokens = int(cached or 0)
    except asyncio.TimeoutError:
        out.error = f"timeout after {timeout:g} s"
    except (aiohttp.ClientError, OSError) as e:
        out.error = _describe(e)
    if not out.error and out.num_tokens == 0:
        out.error = "stream ended without tokens"


def load_average() -> list[float] | None:
    """This (client) machine's load averages, recorded beside live measurements; None off Unix."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
