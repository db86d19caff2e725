"""A small async client for the OpenAI-compatible endpoint: bounded concurrency, timeout, retries.

Retried: transport errors (connection refused or reset, timeouts) and HTTP 429/5xx, with exponential
back-off. Not retried: other 4xx, which a second try would only repeat. Every gate request runs at
temperature 0, so a retry asks the same question again and cannot change the score.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_BACKOFF_S = 0.5
_BACKOFF_MAX_S = 8.0


class EndpointUnreachable(Exception):
    """The endpoint did not answer at all (or refused our credentials): no verdict about the model.

    Distinct from a failed gate so that the CLI maps it to its own exit code.
    """


class RequestFailed(Exception):
    def __init__(self, message: str, status: int | None = None, transport: bool = False):
        super().__init__(message)
        self.status = status
        self.transport = transport


def endpoint_root(base_url: str) -> str:
    """``http://h:8000/v1/`` and ``http://h:8000`` both name the server root ``http://h:8000``."""
    url = base_url.strip().rstrip("/")
    if url.startswith("unix:"):  # the launcher's own engine, on its private socket (engine_link)
        return url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if "://" not in url:
        url = "http://" + url
    return url


def redact_url(url: str) -> str:
    """Drop credentials and the query string: neither belongs in a report."""
    if url.startswith("unix:"):
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    if parts.username or parts.password:
        host = "***@" + host
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _is_loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


class Client:
    def __init__(self, base_url: str, *, api_key: str | None, timeout_s: float, retries: int,
                 concurrency: int):
        self.root = endpoint_root(base_url)
        self.retries = retries
        self._sem = asyncio.Semaphore(concurrency)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        uds = self.root[len("unix:"):] if self.root.startswith("unix:") else None
        self._http = httpx.AsyncClient(
            base_url="http://engine" if uds else self.root,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            limits=limits,
            transport=httpx.AsyncHTTPTransport(uds=uds, limits=limits) if uds else None,
            # Honour HTTP(S)_PROXY for a remote endpoint, but never route a local engine through one
            # (a proxy set for the outside world, without NO_PROXY, would swallow 127.0.0.1).
            trust_env=not uds and not _is_loopback(self.root),
        )

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, payload: dict | None = None) -> httpx.Response:
        """One request with retries; returns a 2xx response or raises RequestFailed."""
        last: RequestFailed | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(_BACKOFF_MAX_S, _BACKOFF_S * 2 ** (attempt - 1)))
            try:
                async with self._sem:
                    resp = await self._http.request(method, path, json=payload)
            except httpx.TransportError as exc:
                last = RequestFailed(f"{method} {path}: {type(exc).__name__}: {exc}".rstrip(": "),
                                     transport=True)
                continue
            if resp.is_success:
                return resp
            last = RequestFailed(f"{method} {path}: HTTP {resp.status_code}: {_error_text(resp)}",
                                 status=resp.status_code)
            if resp.status_code not in _RETRY_STATUS:
                break
        assert last is not None
        raise last

    async def post_json(self, path: str, payload: dict) -> dict[str, Any]:
        resp = await self.request("POST", path, payload)
        try:
            body = resp.json()
        except json.JSONDecodeError:
            raise RequestFailed(f"POST {path}: the answer is not JSON: {resp.text[:200]!r}") from None
        if not isinstance(body, dict):
            raise RequestFailed(f"POST {path}: unexpected answer {str(body)[:200]!r}")
        return body

    async def get_text(self, path: str) -> str:
        return (await self.request("GET", path)).text


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except (json.JSONDecodeError, ValueError):
        return resp.text[:300].strip() or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err)[:300]
        return str(err)[:300]
    return str(body)[:300]


def completion_text(body: dict[str, Any]) -> tuple[str, int]:
    """(text, completion tokens) of a /v1/completions answer."""
    choices = body.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        raise RequestFailed(f"completion without choices: {str(body)[:200]!r}")
    text = choices[0].get("text")
    if not isinstance(text, str):
        raise RequestFailed(f"completion without text: {str(choices[0])[:200]!r}")
    usage = body.get("usage") or {}
    return text, int(usage.get("completion_tokens") or 0)


def chat_text(body: dict[str, Any]) -> tuple[str, int]:
    """(content, completion tokens) of a /v1/chat/completions answer."""
    choices = body.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        raise RequestFailed(f"chat completion without choices: {str(body)[:200]!r}")
    message = choices[0].get("message") or {}
    text = message.get("content") or ""
    usage = body.get("usage") or {}
    return str(text), int(usage.get("completion_tokens") or 0)
