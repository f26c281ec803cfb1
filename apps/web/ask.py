"""The question routes: ask (``POST /api/ask``, answered as server-sent events) and start the
conversation over (``DELETE /api/conversation``). See ``apps.web.server`` for the contract."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from apps.collection import AppError, Token
from apps.web.markdown import render_answer
from apps.web.queue import QueueFullError, QueueTimeoutError, Ticket
from apps.web.sessions import Answerer, Session
from apps.web.state import COOKIE, ApiError, WebState, display, web_state
from apps.web.streaming import EventStream
from ragspec.engine.tenancy import SHARED, in_cache_scope, scoped_key
from ragspec.engine.text import question_text

if TYPE_CHECKING:
    from ragspec.answers import Answer

logger = logging.getLogger(__name__)

router = APIRouter()


class AskBody(BaseModel):
    question: str = Field(min_length=1)
    """(The length check also makes pydantic refuse a lone surrogate: a 400, ``apps.web.server._invalid_request``.)"""


def sse(event: str, data: Any) -> str:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


@router.post("/api/ask")
async def ask(request: Request, body: AskBody, web: WebState = Depends(web_state)) -> Response:
    config, queue = web.config, web.queue
    try:
        question = question_text(body.question)
    except ValueError as e:
        raise HTTPException(422, str(e)) from e
    if len(question) > config.max_question_chars:
        raise HTTPException(413, f"the question is longer than {config.max_question_chars} characters")
    session = web.live_session(request)
    if session is None and COOKIE in request.cookies:
        raise ApiError(410, web.expired_message, code="session_expired")
    answerer = (session.answerer if session else None) or web.preload
    if answerer is None:
        raise HTTPException(409, "no documents yet: upload files or index a folder first")
    if session is None:
        session = web.new_session(request)  # keeps the conversation with the preloaded index
    try:
        ticket = queue.ticket()
    except QueueFullError as e:
        raise ApiError(429, str(e), code="queue_full", headers={"Retry-After": str(e.retry_after_s)}) from e
    return EventStream(
        _answer(web, session, answerer, question, ticket),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        on_close=ticket.release,
    )


async def _answer(web: WebState, session: Session, answerer: Answerer, question: str, ticket: Ticket) -> AsyncIterator[str]:
    from ragspec.bridge import iterate_in_thread, next_before

    config, queue = web.config, web.queue

    async with ticket:  # given back however the answer ends (``on_close`` too, for a stream that never started)
        if queue.running >= queue.slots:
            yield sse("queued", {"position": queue.waiting})  # answers ahead: the running one and those waiting before this
        try:
            await ticket.wait(config.queue_timeout_s)
        except QueueTimeoutError:
            yield sse("error", {"message": f"the server is busy: no model free after {config.queue_timeout_s:g} s, try again"})
            return
        history = list(session.history)
        scope = SHARED if config.shared_prefix_cache else scoped_key("web", session.id)  # see ragspec.engine.tenancy
        events = iterate_in_thread(lambda: in_cache_scope(scope, lambda: answerer.stream(question, history)))
        deadline = time.monotonic() + config.answer_timeout_s
        try:
            while True:
                try:
                    event = await next_before(events, deadline)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    yield sse("error", {"message": f"the answer took longer than {config.answer_timeout_s:g} s and was stopped"})
                    return
                if isinstance(event, Token):
                    yield sse("token", _live(event))
                else:  # the Answer
                    await asyncio.to_thread(web.store.add_turn, session, question, event.text)
                    yield sse("done", _done(event, session))
        except AppError as e:
            yield sse("error", {"message": str(e)})
        except Exception:  # noqa: BLE001 - the stream has started: report in-band, log the rest
            logger.exception("answer failed")
            yield sse("error", {"message": "the answer failed (an error in the server; its log has the details)"})
        finally:
            await events.aclose()


@router.delete("/api/conversation")
async def new_conversation(request: Request, web: WebState = Depends(web_state)) -> dict[str, Any]:
    """Start the conversation over; the documents stay."""
    session = web.live_session(request)
    if session is not None:
        await asyncio.to_thread(web.store.clear_history, session)
    return web.describe(session)


def _done(answer: Answer, session: Session) -> dict[str, Any]:
    """The ``done`` event: the text, as sanitized HTML of its Markdown too, whether a passage backs it
    (``supported``; ``note``, the flag shown when not), the citations (each with its whole passage for the
    page's passage panel, and ``quote``: the sentences the answer drew from) and the generation's stats."""
    return {
        "text": answer.text,
        "html": render_answer(answer.text),
        "supported": answer.supported,
        "note": answer.note,
        "citations": [
            _shown({**c.as_dict(), "quote": c.text, "text": answer.passages[c.number - 1].page_content.strip()}, session)
            for c in answer.citations
        ],
        "stats": answer.stats.reported(),
    }


def _shown(citation: dict[str, Any], session: Session) -> dict[str, Any]:
    """An uploaded file's source as its name, not the server's temporary path."""
    citation["source"] = display(citation["source"], session)
    return citation


def _live(token: Token) -> dict[str, Any]:
    """A token event: the text and the live speed (tokens/s; tokens per forward, approximately)."""
    return {
        "text": token.text,
        "elapsed_s": round(token.elapsed_s, 3),
        "tokens": token.tokens,
        "tokens_per_s": round(token.tokens / token.elapsed_s, 2) if token.elapsed_s > 0 else 0.0,
        "tokens_per_step": round(token.tokens / token.steps, 2) if token.steps else 0.0,
        **({"acceptance": round(token.acceptance, 4)} if token.acceptance is not None else {}),
        **({"tokens_per_forward": round(token.tokens_per_forward, 3)} if token.tokens_per_forward is not None else {}),
    }
