"""Reading an OpenAI request body as vLLM's server reads it: every field typed and bounded,
refused with vLLM's 400 before the request reaches the simulation.

The fields, their types and bounds were read from vLLM's ``CompletionRequest`` and
``ChatCompletionRequest`` (``vllm/entrypoints/openai/protocol.py``, since split into
``vllm/entrypoints/openai/engine/protocol.py``), the checks behind them
(``SamplingParams._verify_args`` in ``vllm/sampling_params.py``: temperature in [0, 2], top_p in
(0, 1], min_tokens <= max_tokens, ...) and the prompt checks of
``vllm/v1/engine/input_processor.py`` ("Token id N is out of vocabulary"). The messages are
vLLM's where vLLM has one. The error body is vLLM's ``ErrorResponse``:
``{"error": {"message", "type", "param", "code"}}``.

Two differences from vLLM, both stricter, both on purpose:

* types are JSON's own: vLLM's pydantic models coerce in lax mode (``"0.5"`` is read as a number,
  ``1`` as true, ``16.0`` as an integer); here a number must be a JSON number, a flag ``true`` or
  ``false``, a count a JSON integer. One rule is easier to state than pydantic's coercion table;
* fields vLLM accepts but a simulation cannot honour change nothing (sampling parameters, stop
  strings, logprobs) once they are well-formed; ``n`` > 1, batched prompts and non-text chat
  parts are refused.

Unknown fields are accepted and ignored, as vLLM does (``extra="allow"``).

Hand-written rather than a pydantic model: the bounds depend on the served model (vocabulary,
``max_model_len``), the messages must name one field in vLLM's words (pydantic's are lists of
its own error records), and the simulator keeps its dependencies few.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INT64 = 2**63 - 1          # vLLM bounds seeds by torch.long
MAX_BODY_BYTES = 64 << 20  # a request body; past it 413 (by Content-Length, before reading)


class RequestError(Exception):
    """A request vLLM would refuse: becomes its error body (``ErrorResponse``) and status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind


def _show(value: Any) -> str:
    """A value for an error message, short whatever the client sent."""
    if isinstance(value, (list, dict)):
        return f"a {'list' if isinstance(value, list) else 'JSON object'} of {len(value)} items"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "...")
    if isinstance(value, int) and abs(value) > 10**20:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; RequestError (400) for anything else, deep nesting too."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise RequestError("JSON decode error: nested too deeply") from None
    except ValueError as e:      # JSONDecodeError, UnicodeDecodeError, a 5,000-digit integer
        raise RequestError(f"JSON decode error: {e}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


# --------------------------------------------------------------------------------------------
# One field


def _integer(body: dict[str, Any], name: str, low: int, high: int | None = INT64, *,
             nullable: bool = True, message: str | None = None) -> int | None:
    v = body.get(name)
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"{name}: expected an integer, got {_show(v)}", name)
    if v < low or (high is not None and v > high):
        raise RequestError(message.format(v=_show(v)) if message else
                           f"{name} must be in [{low}, {high}], got {_show(v)}.", name)
    return v


def _integer_or(body: dict[str, Any], name: str, low: int, default: int, message: str) -> int:
    """A field vLLM types ``int`` with a default: absent is the default, null is refused."""
    if name not in body:
        return default
    v = _integer(body, name, low, None, nullable=False, message=message)
    assert v is not None
    return v


def _number(body: dict[str, Any], name: str, ok: Callable[[float], bool], bounds: str,
            nullable: bool = True) -> float | None:
    v = body.get(name)
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RequestError(f"{name}: expected a number, got {_show(v)}", name)
    if not math.isfinite(v):
        raise RequestError(f"{name} must be a finite number, got {_show(v)}.", name)
    if not ok(v):
        raise RequestError(f"{name} must be in {bounds}, got {_show(v)}.", name)
    return float(v)


def _flag(body: dict[str, Any], name: str, nullable: bool = True) -> bool:
    v = body.get(name)
    if v is None and nullable:
        return False
    if not isinstance(v, bool):
        raise RequestError(f"{name}: expected true or false, got {_show(v)}", name)
    return v


def _string(body: dict[str, Any], name: str) -> str | None:
    v = body.get(name)
    if v is not None and not isinstance(v, str):
        raise RequestError(f"{name}: expected a string, got {_show(v)}", name)
    return v


def _check_common(body: dict[str, Any]) -> None:
    """The sampling fields both endpoints share: typed and bounded as SamplingParams bounds
    them, then ignored (only lengths mean something to the simulation)."""
    for name in ("user", "request_id"):
        _string(body, name)
    for name in ("echo", "skip_special_tokens", "spaces_between_special_tokens",
                 "include_stop_str_in_output", "add_special_tokens", "use_beam_search",
                 "return_tokens_as_token_ids"):
        _flag(body, name)
    _number(body, "temperature", lambda v: 0 <= v <= 2, "[0, 2]")
    _number(body, "top_p", lambda v: 0 < v <= 1, "(0, 1]")
    _number(body, "min_p", lambda v: 0 <= v <= 1, "[0, 1]")
    for name in ("presence_penalty", "frequency_penalty"):
        _number(body, name, lambda v: -2 <= v <= 2, "[-2, 2]")
    _number(body, "repetition_penalty", lambda v: v > 0, "(0, inf)")
    _number(body, "length_penalty", lambda v: True, "any finite number")
    _integer(body, "top_k", -1, message="top_k must be 0 (disable), or at least 1, got {v}.")
    _integer(body, "seed", -INT64 - 1)
    _integer(body, "priority", -INT64 - 1)
    _integer(body, "truncate_prompt_tokens", -1)
    _integer(body, "prompt_logprobs", -1)
    stop = body.get("stop")
    if stop is not None:
        items = [stop] if isinstance(stop, str) else stop
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise RequestError(f"stop: expected a string or a list of strings, got "
                               f"{_show(stop)}", "stop")
        if any(not s for s in items):
            raise RequestError("stop cannot contain an empty string.", "stop")
    ids = body.get("stop_token_ids")
    if ids is not None and (not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids)):
        raise RequestError(f"stop_token_ids must contain only integers, got {_show(ids)}.",
                           "stop_token_ids")
    bias = body.get("logit_bias")
    if bias is not None and (not isinstance(bias, dict) or not all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)
            for b in bias.values())):
        raise RequestError(f"logit_bias: expected an object of token id: finite number, got "
                           f"{_show(bias)}", "logit_bias")


# --------------------------------------------------------------------------------------------
# The prompt


def count_text_tokens(text: str, mode: str) -> int:
    """A tokenizer-free estimate of a text's token count: ``chars`` = ceil(characters / 4),
    ``words`` = whitespace-separated words (exact for a word-level tokenizer)."""
    if mode == "words":
        return len(text.split())
    return math.ceil(len(text) / CHARS_PER_TOKEN)


CHARS_PER_TOKEN = 4.0         # OpenAI's rule of thumb for English text


def _prompt_len(prompt: Any, mode: str, vocab_size: int) -> int:
    """Tokens in a completions ``prompt``: a string, a list of token ids, or a list of one."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        n = count_text_tokens(prompt, mode)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                          for t in prompt):
        if prompt and (min(prompt) < 0 or max(prompt) >= vocab_size):
            bad = min(prompt) if min(prompt) < 0 else max(prompt)
            raise RequestError(f"Token id {_show(bad)} is out of vocabulary (the model's "
                               f"vocabulary has {vocab_size} ids, 0 to {vocab_size - 1})",
                               "prompt")
        n = len(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, (int, float)) and not isinstance(t, bool)
                                          for t in prompt):
        raise RequestError("prompt: token ids must be integers", "prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError("prompt: simserve serve takes one prompt per request (a string or "
                           "a list of token ids), not a batch", "prompt")
    else:
        raise RequestError("prompt: expected a string or a list of token ids", "prompt")
    if n == 0:
        raise RequestError("The prompt cannot be empty.", "prompt")
    return n


def _messages_len(messages: Any, mode: str) -> int:
    """Tokens in a chat ``messages`` list: its text contents, estimated (no chat template)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: expected a non-empty list of messages", "messages")
    parts: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}]: expected an object", "messages")
        if not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}].role: expected a string, got "
                               f"{_show(m.get('role'))}", "messages")
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for j, p in enumerate(content):
                if not isinstance(p, dict) or p.get("type", "text") != "text" or \
                        not isinstance(p.get("text"), str):
                    raise RequestError(f"messages[{i}].content[{j}]: expected a text part "
                                       f'{{"type": "text", "text": "..."}}; simserve serve '
                                       f"counts text only", "messages")
                parts.append(p["text"])
        elif content is not None:
            raise RequestError(f"messages[{i}].content: expected a string or a list of parts",
                               "messages")
    n = count_text_tokens(" ".join(parts), mode)
    if n == 0:
        raise RequestError("The prompt cannot be empty.", "messages")
    return n


# --------------------------------------------------------------------------------------------
# A whole request


@dataclass(frozen=True)
class Limits:
    """What the served model allows."""

    model_name: str
    max_model_len: int
    vocab_size: int


@dataclass(frozen=True)
class GenerateRequest:
    """What the simulation and the response need from a valid request."""

    prompt_len: int
    max_tokens: int | None         # as asked (max_completion_tokens for chat, if given)
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    return_token_ids: bool
    # stream_options.continuous_usage_stats (with include_usage): usage in every chunk
    continuous_usage: bool = False


def read_request(body: dict[str, Any], chat: bool, limits: Limits,
                 text_tokens: str = "chars") -> GenerateRequest:
    """Check every field vLLM checks (module docstring); RequestError at the first bad one."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"model: expected a string, got {_show(model)}", "model")
    if model is not None and model != limits.model_name:
        raise RequestError(f"The model `{model[:200]}` does not exist.", "model", 404,
                           "NotFoundError")
    if _integer_or(body, "n", 1, 1, "n must be at least 1, got {v}.") > 1:
        raise RequestError("n: simserve serve returns one choice per request", "n")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(f"stream_options: expected an object, got {_show(options)}",
                           "stream_options")
    if options and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.",
                           "stream_options")
    include_usage = continuous = False
    if options is not None:      # vLLM's StreamOptions: include_usage defaults to true
        try:
            include_usage = _flag(options, "include_usage") if "include_usage" in options \
                else True
            continuous = _flag(options, "continuous_usage_stats") and include_usage
        except RequestError as e:
            raise RequestError(f"stream_options.{e.message}", f"stream_options.{e.param}") \
                from None
    ignore_eos = _flag(body, "ignore_eos", nullable=False) if "ignore_eos" in body else False
    return_ids = _flag(body, "return_token_ids")
    _check_common(body)
    if chat:
        _flag(body, "logprobs")
        _integer(body, "top_logprobs", 0)
        prompt_len = _messages_len(body.get("messages"), text_tokens)
        # both are checked; max_completion_tokens wins when both are given (as in vLLM)
        legacy = _integer(body, "max_tokens", 1, None,
                          message="max_tokens must be at least 1, got {v}.")
        name = "max_completion_tokens"
        max_tokens = _integer(body, name, 1, None,
                              message=f"{name} must be at least 1, got {{v}}.")
        if max_tokens is None:
            name, max_tokens = "max_tokens", legacy
    else:
        _integer(body, "logprobs", -1, message="logprobs must be non-negative or -1, got {v}.")
        _string(body, "suffix")
        if body.get("prompt") is None:
            raise RequestError("prompt: a required field (a string or a list of token ids)",
                               "prompt")
        prompt_len = _prompt_len(body["prompt"], text_tokens, limits.vocab_size)
        name = "max_tokens"
        max_tokens = _integer(body, name, 1, None,
                              message="max_tokens must be at least 1, got {v}.")
    min_tokens = _integer_or(body, "min_tokens", 0, 0,
                             "min_tokens must be greater than or equal to 0, got {v}.")
    limit = limits.max_model_len
    if max_tokens is not None and max_tokens > limit:
        raise RequestError(f"{name}={_show(max_tokens)} cannot be greater than max_model_len="
                           f"{limit}. Please request fewer output tokens.", name)
    if prompt_len >= limit:
        raise RequestError(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {prompt_len} input tokens, which exceeds this limit even without any "
            f"output tokens. Please reduce the length of the input prompt.", "input_tokens")
    if max_tokens is not None and min_tokens > max_tokens:
        raise RequestError(f"min_tokens must be less than or equal to max_tokens="
                           f"{max_tokens}, got {_show(min_tokens)}.", "min_tokens")
    room = limit - prompt_len          # vLLM's max_tokens when none is given
    if max_tokens is None and min_tokens > room:
        raise RequestError(f"min_tokens must be less than or equal to max_tokens={room} (the "
                           f"context left: max_model_len {limit} - {prompt_len} prompt tokens),"
                           f" got {_show(min_tokens)}.", "min_tokens")
    return GenerateRequest(prompt_len, max_tokens, min_tokens, ignore_eos, stream,
                           include_usage, return_ids, continuous)
