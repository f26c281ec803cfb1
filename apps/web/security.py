"""The checks in front of every HTTP route of ``ragspec serve``: one pure-ASGI middleware, ``Guard``.

For each request, in this order (the first that fails answers at once; the app never sees it):

1. **Host** (DNS rebinding): the ``Host`` header must name a trusted host, by default the
   loopback names and the address the server is bound to. A page on another site that rebinds
   its own name to 127.0.0.1 still sends its own name as ``Host``, and gets a 400.
2. **Origin** (cross-site requests): a state-changing request (anything but GET, HEAD,
   OPTIONS) with an ``Origin`` must come from the server's own origin (same host and port as
   ``Host``); ``Origin: null`` and ``Sec-Fetch-Site: cross-site`` / ``same-site`` get a 403.
3. **API key**: when one is configured, every route under a protected prefix (``/api/`` and
   ``/v1/``) needs ``Authorization: Bearer KEY`` (compared in constant time; the key is never
   logged or echoed), else a 401.
4. **Body size**: a declared ``Content-Length`` over the route's limit gets a 413 before the
   body is read; a body without one (chunked) is counted as it arrives, and the 413 goes out
   as soon as the count crosses the limit, so no more than the limit is ever read.

Every response, the guard's own included, carries ``SECURITY_HEADERS`` (a Content Security
Policy that allows only the server's own scripts and no framing, ``X-Frame-Options: DENY``,
``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``).

The policy is a frozen ``SecurityPolicy``; routes added later (the OpenAI-compatible ``/v1``
ones) are covered by the same guard, and can have their own body limit and error shape.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

logger = logging.getLogger(__name__)

LOCAL_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
"""Host names a loopback-bound server answers to."""
ANY_HOST = "*"
"""In a trusted-hosts list: any ``Host`` (only sensible with an API key)."""
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MIN_API_KEY_CHARS = 16

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)

ErrorBody = Callable[[str, int, str], Any]
"""``error_body(path, status, message)``: the JSON body of a rejection for that path."""


class InsecureBindError(ValueError):
    """Binding an address other machines can reach, without an API key."""


def plain_error(path: str, status: int, message: str) -> dict[str, str]:
    """The web app's error shape: ``{"error": message}``."""
    return {"error": message}


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_api_key(api_key: str | None) -> None:
    """Raise ``ValueError`` for a key that is too short or cannot travel in an HTTP header."""
    if api_key is None:
        return
    if len(api_key) < MIN_API_KEY_CHARS or not api_key.isascii() or not api_key.isprintable() or " " in api_key:
        raise ValueError(
            f"the API key must be at least {MIN_API_KEY_CHARS} printable ASCII characters without spaces; "
            "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


def require_key_off_loopback(host: str, api_key: str | None) -> None:
    """Refuse to serve a non-loopback address without an API key."""
    if api_key is None and not is_loopback(host):
        raise InsecureBindError(
            f"binding {host or '*'} makes the app reachable from other machines, so it needs an API key: "
            "set RAGSPEC_API_KEY (or pass --api-key KEY); clients then send 'Authorization: Bearer KEY'"
        )


def normalize_host(name: str) -> str:
    """A trusted-host entry as it is compared: lower case, no brackets or trailing dot.

    Raises ``ValueError`` for something that is not a bare host name or address (a port, a
    scheme or a path).
    """
    host = name.strip().lower()
    if host == ANY_HOST:
        return host
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    host = host.rstrip(".")
    if not host or any(c in host for c in "/@ ?#") or (":" in host and not _is_ip(host)):
        raise ValueError(f"a trusted host is a bare name or address like 'notes.example' or '192.168.1.5', got {name!r}")
    return host


def trusted_hosts_for(bind_host: str, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The hosts a server bound to ``bind_host`` answers to.

    The loopback names, the bound address itself, and ``extra``. A wildcard bind
    (``0.0.0.0``, ``::``) with no ``extra`` answers to any ``Host``: there is no single name
    to check, and the API key such a bind requires is the defence.
    """
    extra_hosts = [normalize_host(h) for h in extra]
    if bind_host in WILDCARD_ADDRESSES and not extra_hosts:
        return (ANY_HOST,)
    hosts = [*LOCAL_HOSTS, *([] if bind_host in WILDCARD_ADDRESSES else [normalize_host(bind_host)]), *extra_hosts]
    return tuple(dict.fromkeys(hosts))


@dataclass(frozen=True)
class SecurityPolicy:
    """What ``Guard`` enforces; checked when built."""

    trusted_hosts: tuple[str, ...] = LOCAL_HOSTS
    """Names accepted in the ``Host`` header (``"*"``: any)."""
    api_key: str | None = field(default=None, repr=False)
    """When set, required as ``Authorization: Bearer KEY`` under ``protected_prefixes``."""
    protected_prefixes: tuple[str, ...] = ("/api/", "/v1/")
    max_body_bytes: int = 2**20
    """Largest request body, unless ``body_limits`` says otherwise for the path."""
    body_limits: Mapping[str, int] = field(default_factory=dict)
    """Path prefix -> largest body there (the longest matching prefix wins)."""
    error_body: ErrorBody = plain_error

    def __post_init__(self) -> None:
        if not self.trusted_hosts:
            raise ValueError("trusted_hosts is empty: no request could reach the app")
        object.__setattr__(self, "trusted_hosts", tuple(normalize_host(h) for h in self.trusted_hosts))
        check_api_key(self.api_key)
        if ANY_HOST in self.trusted_hosts and self.api_key is None:
            raise InsecureBindError(
                "trusting any Host header needs an API key: without the Host check, a web page on any site "
                "can reach the app through DNS rebinding; set RAGSPEC_API_KEY (or --api-key) or list the host names"
            )
        for prefix, limit in {"": self.max_body_bytes, **self.body_limits}.items():
            if limit < 1:
                raise ValueError(f"body limit for {prefix or 'every path'!r} must be >= 1, got {limit}")

    def body_limit(self, path: str) -> int:
        matches = [p for p in self.body_limits if path.startswith(p)]
        return self.body_limits[max(matches, key=len)] if matches else self.max_body_bytes

    def trusts(self, host: str) -> bool:
        return ANY_HOST in self.trusted_hosts or host in self.trusted_hosts

    def key_matches(self, authorization: str | None) -> bool:
        if self.api_key is None:
            return True
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode("utf-8", "replace"), self.api_key.encode("ascii"))


class Guard:
    """Pure ASGI middleware enforcing a ``SecurityPolicy`` (see the module docstring)."""

    def __init__(self, app: Any, policy: SecurityPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":  # no route takes one: refused, rather than let past the checks below
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = self.policy
        headers = _headers(scope)
        path = scope["path"]

        async def send_secure(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *[h for h in SECURITY_HEADERS if h[0] not in present]]
            await send(message)

        async def reject(status: int, message: str, extra: Mapping[str, str] | None = None) -> None:
            response = JSONResponse(policy.error_body(path, status, message), status_code=status, headers=dict(extra or {}))
            await response(scope, receive, send_secure)

        host_header = headers.get("host", "")
        host = _host_name(host_header)
        if host is None or not policy.trusts(host):
            await reject(400, _untrusted_host_message(host_header, policy))
            return
        if scope["method"] not in SAFE_METHODS:
            problem = _cross_site_problem(headers, host_header)
            if problem:
                await reject(403, problem)
                return
        if any(path.startswith(p) for p in policy.protected_prefixes) and not policy.key_matches(headers.get("authorization")):
            await reject(401, "missing or wrong API key: send 'Authorization: Bearer KEY'", {"WWW-Authenticate": "Bearer"})
            return

        limit = policy.body_limit(path)
        too_large = f"the request body is larger than {_size(limit)}"
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await reject(413, too_large, {"Connection": "close"})
            return

        received = 0
        answered = False  # the guard sent a 413 itself: whatever the app does after that is dropped
        started = False

        async def counted_receive() -> dict[str, Any]:
            nonlocal received, answered
            if answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if not started:
                        await reject(413, too_large, {"Connection": "close"})
                        answered = True
                    return {"type": "http.disconnect"}  # the app stops reading as if the client had gone
            return message

        async def app_send(message: dict[str, Any]) -> None:
            nonlocal started
            if answered:
                return
            if message["type"] == "http.response.start":
                started = True
            await send_secure(message)

        try:
            await self.app(scope, counted_receive, app_send)
        except ClientDisconnect:  # the client left mid-body: nobody to answer, nothing worth an error log
            logger.debug("the client of %s %s left before its body was read", scope["method"], path)
        except Exception:
            if answered:  # after the guard's 413, the app's "client went away" errors are expected
                return
            if started:
                raise
            # Answered here, not by Starlette's outermost error handler: with the security headers
            # and the route's error shape, and without the exception's text.
            logger.exception("unhandled error in %s %s", scope["method"], path)
            await reject(500, "internal server error (logged on the server)")


def _headers(scope: Any) -> dict[str, str]:
    """The request's headers by lower-case name (the first of repeated ones)."""
    out: dict[str, str] = {}
    for name, value in scope["headers"]:
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_name(value: str) -> str | None:
    """The name in a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), normalized; None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        name, rest = value[1:end], value[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
    else:
        name, _, port = value.partition(":")
        if port and not port.isdigit():
            return None
    name = name.rstrip(".")
    return name or None


def _authority(value: str, scheme: str) -> str:
    """``host[:port]`` lower-cased, without the scheme's default port."""
    value = value.strip().lower()
    default = {"http": ":80", "https": ":443"}.get(scheme, "")
    return value[: -len(default)] if default and value.endswith(default) else value


def _cross_site_problem(headers: Mapping[str, str], host_header: str) -> str | None:
    """Why a state-changing request looks cross-site, or None."""
    fetch_site = headers.get("sec-fetch-site", "").lower()
    if fetch_site in ("cross-site", "same-site"):
        return f"cross-origin request refused (Sec-Fetch-Site: {fetch_site}): use the page this server serves"
    origin = headers.get("origin")
    if origin is None:
        return None  # not from a browser page (curl, scripts), or an old browser on a same-origin GET-like request
    origin_scheme, sep, authority = origin.strip().partition("://")
    if not sep or "/" in authority:
        return f"cross-origin request refused (Origin: {origin[:100]})"
    # Host and port only: behind a TLS proxy the page is https while the hop to this server is http.
    origin_scheme = origin_scheme.lower()
    if _authority(authority, origin_scheme) != _authority(host_header, origin_scheme):
        return f"cross-origin request refused (Origin: {origin[:100]}): use the page this server serves"
    return None


def _untrusted_host_message(host_header: str, policy: SecurityPolicy) -> str:
    if not host_header:
        return "the request has no Host header"
    return (
        f"untrusted Host header {host_header[:100]!r}: this server answers to {', '.join(policy.trusted_hosts)}; "
        "start it with --trusted-host NAME to add a name"
    )


def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n} bytes"
