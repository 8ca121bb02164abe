"""Who may see and act: the token, the session cookie, CSRF tokens, allowed hosts, headers.

* Token (optional): every request needs ``Authorization: Bearer T``, a session cookie minted after
  one, or ``?token=T`` once (answered with a redirect to the same address without it, setting the
  cookie); anything else is 401.
* Session: a random id in a signed cookie (``HttpOnly``, ``SameSite=Strict``, scoped to the
  dashboard's path). The CSRF token is an HMAC of the session id: every POST must carry it
  (form field ``csrf_token`` or header ``X-CSRF-Token``), else 403 — checked by
  :meth:`Guard.csrf_ok` in the one function all actions go through.
* Allowed hosts (optional): the ``Host`` header must name one of them (the CLI allows only loopback
  names when it runs without a token, against DNS rebinding).
* Headers on every answer: a Content-Security-Policy without inline scripts or styles, no framing,
  ``nosniff``, no referrer (so a ``?token=`` never leaks), ``no-store`` for pages.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any, Final
from urllib.parse import parse_qsl, quote, urlencode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SESSION_COOKIE: Final = "scheduler_dashboard"
CSRF_FIELD: Final = "csrf_token"
CSRF_HEADER: Final = "x-csrf-token"
LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1"})
SECURITY_HEADERS: Final = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


def root_path(scope: Scope) -> str:
    """Where the dashboard is mounted (``""`` at the server's root)."""
    return str(scope.get("root_path", "")).rstrip("/")


def route_path(scope: Scope) -> str:
    """The request path below the mount point."""
    path, root = str(scope.get("path", "/")), root_path(scope)
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :] or "/"
    return path


def request_host(scope: Scope) -> str | None:
    """The host name of the ``Host`` header, lower-cased, without port or IPv6 brackets."""
    for name, value in scope.get("headers", ()):
        if name == b"host":
            host = str(value.decode("latin-1")).strip().lower()
            if host.startswith("["):
                return host[1 : host.find("]")] if "]" in host else None
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return None


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return str(value.decode("latin-1"))
    return None


class Guard:
    """The dashboard's secrets and checks (one per application)."""

    def __init__(self, token: str | None, secret: bytes | None, allowed_hosts: Iterable[str] | None) -> None:
        self.token = token
        if secret is None:
            secret = (
                hmac.new(token.encode(), b"scheduler-dashboard-session", hashlib.sha256).digest()
                if token is not None
                else secrets.token_bytes(32)
            )
        self._secret = secret
        self._mode = b"token" if token is not None else b"open"
        self.allowed_hosts = None if allowed_hosts is None else frozenset(h.lower() for h in allowed_hosts)

    # ---------------------------------------------------------------- signing

    def _mac(self, purpose: bytes, data: bytes) -> str:
        digest = hmac.new(self._secret, purpose + b"\0" + self._mode + b"\0" + data, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def sign(self, purpose: bytes, data: bytes) -> str:
        """``data`` with a signature of this application, as cookie-safe text."""
        encoded = base64.urlsafe_b64encode(data).decode().rstrip("=")
        return f"{encoded}.{self._mac(purpose, data)}"

    def unsign(self, purpose: bytes, text: str | None) -> bytes | None:
        """The data :meth:`sign` signed, or ``None`` if ``text`` is not such a value."""
        if not text or text.count(".") != 1:
            return None
        encoded, mac = text.split(".")
        try:
            data = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        except ValueError:
            return None
        return data if hmac.compare_digest(mac, self._mac(purpose, data)) else None

    # ---------------------------------------------------------------- sessions and CSRF

    def session_of(self, cookie: str | None) -> str | None:
        data = self.unsign(b"session", cookie)
        return None if data is None else data.decode("ascii", "replace")

    def new_session(self) -> tuple[str, str]:
        """A fresh session id and its cookie value."""
        session = secrets.token_urlsafe(18)
        return session, self.sign(b"session", session.encode())

    def csrf_token(self, session: str) -> str:
        return self._mac(b"csrf", session.encode())

    def csrf_ok(self, session: str | None, submitted: str | None) -> bool:
        if not session or not submitted:
            return False
        return hmac.compare_digest(submitted.encode(), self.csrf_token(session).encode())

    def token_ok(self, offered: str | None) -> bool:
        if self.token is None or offered is None:
            return False
        return hmac.compare_digest(offered.encode(), self.token.encode())


def cookie_value(scope: Scope, name: str) -> str | None:
    header = _header(scope, b"cookie")
    if not header:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # a malformed Cookie header is no session
        return None
    morsel = jar.get(name)
    return None if morsel is None else str(morsel.value)


def set_cookie_header(
    scope: Scope, name: str, value: str, *, max_age: int | None = None
) -> tuple[bytes, bytes]:
    secure = "; Secure" if scope.get("scheme") == "https" else ""
    age = "" if max_age is None else f"; Max-Age={max_age}"
    path = root_path(scope) or "/"
    text = f"{name}={value}; Path={path}; HttpOnly; SameSite=Strict{age}{secure}"
    return b"set-cookie", text.encode("latin-1")


async def _plain(send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]]) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *SECURITY_HEADERS,
                (b"cache-control", b"no-store"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _unauthorized(send: Send, reason: str) -> None:
    text = f"401 Unauthorized: {reason} (Authorization: Bearer <token>, or ?token=<token> once)"
    await _plain(send, 401, text, [(b"www-authenticate", b'Bearer realm="scheduler dashboard"')])


class SecurityMiddleware:
    """Host check, token, session cookie and security headers around the dashboard (pure ASGI)."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        guard = self.guard
        if guard.allowed_hosts is not None and request_host(scope) not in guard.allowed_hosts:
            await _plain(send, 403, "403 Forbidden: this host name is not allowed", [])
            return
        if scope["method"] not in ("GET", "HEAD", "POST"):
            await _plain(send, 405, "405 Method Not Allowed", [(b"allow", b"GET, HEAD, POST")])
            return
        session = guard.session_of(cookie_value(scope, SESSION_COOKIE))
        if guard.token is not None and session is None:
            if await self._token_query(scope, send):
                return
            authorization = _header(scope, b"authorization") or ""
            scheme, _, offered = authorization.partition(" ")
            if scheme.lower() != "bearer" or not guard.token_ok(offered.strip()):
                await _unauthorized(send, "this dashboard needs its token")
                return
        new_cookie = None
        if session is None:
            session, cookie = guard.new_session()
            new_cookie = set_cookie_header(scope, SESSION_COOKIE, cookie)
        scope.setdefault("state", {})["dashboard_session"] = session
        is_static = route_path(scope).startswith("/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.extend(SECURITY_HEADERS)
                if not is_static:
                    headers.append((b"cache-control", b"no-store"))
                if new_cookie is not None:
                    headers.append(new_cookie)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _token_query(self, scope: Scope, send: Send) -> bool:
        """``?token=T``: a valid token starts a session and redirects to the address without it."""
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        offered = [value for name, value in query if name == "token"]
        if not offered:
            return False
        if not self.guard.token_ok(offered[0]):
            await _unauthorized(send, "wrong token")
            return True
        _, cookie = self.guard.new_session()
        rest = urlencode([(name, value) for name, value in query if name != "token"])
        path = "/" + quote(route_path(scope).lstrip("/"))  # never "//host": no redirect elsewhere
        location = root_path(scope) + path + (f"?{rest}" if rest else "")
        headers = [
            (b"location", location.encode("latin-1")),
            set_cookie_header(scope, SESSION_COOKIE, cookie),
        ]
        await _plain(send, 303, "303 See Other", headers)
        return True
