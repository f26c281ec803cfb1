"""Rendering a ``/v1`` generation: a whole ``chat.completion`` / ``text_completion`` or its SSE chunks,
with ``usage``, the ``ragspec`` extension and vLLM's ``metrics``; tool calls in OpenAI's form."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from apps.web.openai_api.errors import OpenAIError, error_object, generation_error
from apps.web.openai_api.jobs import Event, Job
from apps.web.queue import Ticket
from apps.web.retrieval_api import extension as retrieval_extension
from ragspec.bridge import next_before


def _finish(reason: str) -> str:
    """ragspec's finish reason in OpenAI's terms."""
    return "length" if reason in ("length", "timeout") else "stop"


def _usage(stats: Any, prompt_tokens: int, prediction: int | None = None) -> dict[str, Any]:
    """OpenAI's ``usage``; with a ``prediction`` (its index among the drafting references) its details too."""
    completion = int(getattr(stats, "new_tokens", 0))
    prompt = int(getattr(stats, "prompt_tokens", 0) or prompt_tokens)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if prediction is not None:
        usage["completion_tokens_details"] = prediction_details(stats, prediction)
    return usage


def prediction_details(stats: Any, index: int) -> dict[str, int]:
    """Predicted Outputs' counts from ragspec's drafting stats of the prediction (reference ``index``):
    ``accepted_prediction_tokens``, tokens copied from the prediction as drafts that the model verified
    and kept; ``rejected_prediction_tokens``, tokens copied from it that the model verified and refused
    (each draft stops at the first refused token, so these are the refused token and what followed it in
    that draft). Prediction tokens never proposed (no match, or the policy chose a shorter draft) count in
    neither; neither changes ``completion_tokens``, which counts the output's tokens."""
    drafts = getattr(stats, "by_reference", {}).get(index)
    accepted = drafts.accepted if drafts is not None else 0
    drafted = drafts.drafted if drafts is not None else 0
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": drafted - accepted}


def _ragspec(stats: Any, finish_reason: str, ticket: Ticket, model_name: str) -> dict[str, Any]:
    shown = stats.reported() if hasattr(stats, "reported") else {}
    return {**shown, "finish_reason": finish_reason, "queue_s": round(ticket.waited_s, 3), "model": model_name}


def _metrics(stats: Any) -> dict[str, Any]:
    """vLLM's per-request ``metrics`` member, or nothing where no drafting figures exist."""
    drafting = stats.speculative_decoding() if hasattr(stats, "speculative_decoding") else None
    return {"metrics": {"speculative_decoding": drafting}} if drafting is not None else {}


def sse_data(payload: object) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class Completion:
    """One generation of a ``/v1`` request, collected whole or as stream chunks."""

    def __init__(self, job: Job, ticket: Ticket, events: AsyncIterator[Event], model_name: str, deadline: float) -> None:
        self.job = job
        self.ticket = ticket
        self.events = events
        self.model_name = model_name
        self.deadline = deadline
        self.id = ("chatcmpl-" if job.request.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.stats: Any = None
        self.result: Any = None
        """The generation's result: a ``GenerationResult``, or a retrieval request's ``ragspec.answers.Answer``."""
        self.text = ""

    async def _next(self) -> Event | None:
        """The next event; None at the end; ``TimeoutError`` past the deadline."""
        try:
            return await next_before(self.events, self.deadline)
        except StopAsyncIteration:
            return None

    async def run(self) -> AsyncIterator[str]:
        """Text deltas; afterwards ``finish_reason`` and ``stats`` are set."""
        self.finish_reason = "timeout"
        while True:
            try:
                event = await self._next()
            except TimeoutError:
                return  # cut: the events' clean-up has stopped the generation
            if event is None:
                return
            if isinstance(event, tuple):
                self.stats = event[1]
            elif isinstance(event, str):
                self.text += event
                yield event
            else:
                self.result, self.stats, self.finish_reason = event, event.stats, event.finish_reason

    def usage(self) -> dict[str, Any]:
        request = self.job.request
        return _usage(self.stats, len(self.job.prompt_ids), None if request.prediction is None else len(request.references))

    def extension(self) -> dict[str, Any]:
        out = _ragspec(self.stats, self.finish_reason, self.ticket, self.model_name)
        if self.job.retrieved is not None and self.result is not None:
            out["retrieval"] = retrieval_extension(self.result)
        return out

    async def whole(self) -> dict[str, Any]:
        try:
            async for _ in self.run():
                pass
        except Exception as e:  # noqa: BLE001 - mapped to an OpenAI error
            raise generation_error(e, self._constraint_param()) from e
        request = self.job.request
        finish = _finish(self.finish_reason)
        if request.chat:
            shown = self.result.text if self.job.retrieved is not None and self.result is not None else self.text
            message: dict[str, Any] = {"role": "assistant", "content": shown}  # an abstaining retrieval answer: its note
            if request.tools:
                calls = self._calls()
                pieces = [*calls.add(self.text), *calls.flush()]
                message, finish = self._call_message(pieces, finish)
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": self.text, "logprobs": None, "finish_reason": finish}
        return {
            "id": self.id,
            "object": "chat.completion" if request.chat else "text_completion",
            "created": self.created,
            "model": request.model,
            "choices": [choice],
            "usage": self.usage(),
            "ragspec": self.extension(),
            **_metrics(self.stats),
        }

    def _constraint_param(self) -> str:
        """The parameter the answer's grammar came from."""
        return "tools" if self.job.request.tools and self.job.request.response_format is None else "response_format"

    def _calls(self) -> Any:
        """A ``ragspec.engine.tool_calls.CallStream`` for this answer's text."""
        from ragspec.engine.tool_calls import CallStream

        return CallStream()

    def _call_message(self, pieces: list[Any], finish: str) -> tuple[dict[str, Any], str]:
        """The message of an answer with tools and its finish reason: ``tool_calls`` when it made
        them, its text when it answered in text or left a call unfinished."""
        calls = [_tool_call(p) for p in pieces if p.name is not None and p.error is None]
        if any(p.error for p in pieces) or not calls:
            return {"role": "assistant", "content": self.text, **({"tool_calls": calls} if calls else {})}, finish
        return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"

    def chunk(self, delta: dict[str, Any] | str | None, finish: str | None = None) -> dict[str, Any]:
        """One stream chunk: a chat ``delta`` object or a completion's text, and the finish reason."""
        request = self.job.request
        if request.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": delta} if isinstance(delta, str) else delta or {}}
        else:
            choice = {"index": 0, "text": delta or ""}
        choice.update({"logprobs": None, "finish_reason": finish})
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if request.chat else "text_completion",
            "created": self.created,
            "model": request.model,
            "choices": [choice],
        }
        if request.include_usage:
            out["usage"] = None  # as OpenAI: null on every chunk but the last
        return out

    async def chunks(self) -> AsyncIterator[str]:
        """The SSE stream: a role chunk (chat), text chunks, the finish chunk with ``ragspec``, usage, ``[DONE]``."""
        request = self.job.request
        try:
            finish = None
            if request.chat:
                yield sse_data(self.chunk({"role": "assistant", "content": ""}))
            if request.tools:  # calls are sent whole, each once it is complete
                calls = self._calls()
                async for delta in self.run():
                    for piece in calls.add(delta):
                        yield sse_data(self.chunk(_piece_delta(piece)))
                held = calls.flush()
                for piece in held:
                    yield sse_data(self.chunk(_piece_delta(piece)))
                if calls.mode == "calls" and not held:
                    finish = "tool_calls"
            else:
                async for delta in self.run():
                    yield sse_data(self.chunk(delta))
                if self.job.retrieved is not None and self.result is not None and self.result.stream_flag:
                    yield sse_data(self.chunk(self.result.stream_flag))  # an abstaining retrieval answer's note
            yield sse_data({**self.chunk(None, finish or _finish(self.finish_reason)), "ragspec": self.extension(),
                            **_metrics(self.stats)})
            if request.include_usage:
                yield sse_data({**self.chunk(None), "choices": [], "usage": self.usage()})
        except Exception as e:  # noqa: BLE001 - the stream has started: report in-band, as OpenAI does
            error = generation_error(e, self._constraint_param())
            yield sse_data(error_object(error.status, error.message, code=error.code))
        finally:
            await self.events.aclose()  # stops the generation if the stream ended early
        yield "data: [DONE]\n\n"


def _tool_call(piece: Any) -> dict[str, Any]:
    """One complete call (a ``CallStreamPiece``) in OpenAI's form."""
    return {"id": piece.id, "type": "function", "function": {"name": piece.name, "arguments": piece.args}}


def _piece_delta(piece: Any) -> dict[str, Any]:
    """A stream delta for one ``CallStreamPiece``: text, a whole call, or (a call the answer left
    unfinished) the answer's text as written."""
    if piece.error is not None:
        return {"content": piece.args}
    if piece.name is None:
        return {"content": piece.text}
    return {"tool_calls": [{"index": piece.index, **_tool_call(piece)}]}


