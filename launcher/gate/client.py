"""The gate's client: the OpenAI Python client, so the gate speaks to the endpoint as users' code does.

``AsyncOpenAI`` brings the typed responses and the retries (connection errors, timeouts, 408, 409, 429
and 5xx, with exponential back-off; other 4xx are not retried, a second try would only repeat them).
Every gate request runs at temperature 0, so a retry asks the same question again and cannot change the
score. The launcher's own engine listens on a Unix socket (launcher/engine_link.py): the client then
speaks through an HTTP transport bound to that socket. ``/metrics`` (spec-decode counters) is not an
OpenAI route; it is read through the same client, with the same retries and credentials.
"""
from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit


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
        # Imported here: the client costs ~0.6 s to import and a profile (which names the gate's
        # config) is read by commands that never speak to an endpoint. openai 3 speaks through
        # httpx2 (httpx's API): its client and transport are what AsyncOpenAI accepts.
        import httpx2
        import openai

        self._sdk = openai  # its error classes, for _call
        self.root = endpoint_root(base_url)
        self._sem = asyncio.Semaphore(concurrency)
        uds = self.root[len("unix:"):] if self.root.startswith("unix:") else None
        # Seen through a Unix socket, the host name is a formality.
        self._http_root = "http://engine" if uds else self.root
        timeout = httpx2.Timeout(timeout_s, connect=min(10.0, timeout_s))
        limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        http = httpx2.AsyncClient(
            timeout=timeout,
            limits=limits,
            transport=httpx2.AsyncHTTPTransport(uds=uds, limits=limits) if uds else None,
            # Honour HTTP(S)_PROXY for a remote endpoint, but never route a local engine through one
            # (a proxy set for the outside world, without NO_PROXY, would swallow 127.0.0.1).
            trust_env=not uds and not _is_loopback(self.root),
        )
        # Without a key, the placeholder vLLM's docs give its users (the client insists on one; an
        # endpoint without --api-key ignores it), never OPENAI_API_KEY from the environment.
        self._openai = openai.AsyncOpenAI(base_url=self._http_root + "/v1", api_key=api_key or "EMPTY",
                                          max_retries=retries, timeout=timeout, http_client=http)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._openai.close()

    async def _call(self, what: str, make: Any) -> Any:
        """Await ``make()`` under the concurrency bound; the client's errors become RequestFailed."""
        openai = self._sdk
        try:
            async with self._sem:
                return await make()
        except openai.APIStatusError as exc:
            raise RequestFailed(f"{what}: HTTP {exc.status_code}: {_error_text(exc)}",
                                status=exc.status_code) from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise RequestFailed(f"{what}: {type(cause).__name__}: {cause}".rstrip(": "), transport=True) from None
        except (openai.APIResponseValidationError, ValueError, TypeError) as exc:
            raise RequestFailed(f"{what}: unexpected answer: {str(exc)[:200]}") from None

    async def models(self) -> list[str]:
        """The ids ``/v1/models`` lists."""
        page = await self._call("GET /v1/models", self._openai.models.list)
        return [str(m.id) for m in (getattr(page, "data", None) or [])]

    async def complete(self, params: dict[str, Any]) -> tuple[str, int]:
        """(text, completion tokens) of a ``/v1/completions`` answer."""
        body = await self._call("POST /v1/completions", lambda: self._openai.completions.create(**params))
        choices = getattr(body, "choices", None) or []
        if not choices:
            raise RequestFailed(f"completion without choices: {str(body)[:200]!r}")
        text = getattr(choices[0], "text", None)
        if not isinstance(text, str):
            raise RequestFailed(f"completion without text: {str(choices[0])[:200]!r}")
        return text, _completion_tokens(body)

    async def completion_choice(self, params: dict[str, Any]) -> dict[str, Any]:
        """The first choice of a ``/v1/completions`` answer as a dict, vLLM's own fields included
        (``token_ids``, ``prompt_token_ids``, ``prompt_logprobs``: ask for them through ``extra_body``)."""
        body = await self._call("POST /v1/completions", lambda: self._openai.completions.create(**params))
        choices = getattr(body, "choices", None) or []
        if not choices:
            raise RequestFailed(f"completion without choices: {str(body)[:200]!r}")
        return choices[0].model_dump()

    async def chat(self, params: dict[str, Any]) -> tuple[str, int]:
        """(content, completion tokens) of a ``/v1/chat/completions`` answer."""
        body = await self._call("POST /v1/chat/completions",
                                lambda: self._openai.chat.completions.create(**params))
        choices = getattr(body, "choices", None) or []
        if not choices:
            raise RequestFailed(f"chat completion without choices: {str(body)[:200]!r}")
        message = getattr(choices[0], "message", None)
        return str(getattr(message, "content", None) or ""), _completion_tokens(body)

    async def metrics_text(self) -> str:
        """The Prometheus text of ``/metrics`` (beside ``/v1``, not under it)."""
        return await self._call("GET /metrics",
                                lambda: self._openai.get(self._http_root + "/metrics", cast_to=str))


def _completion_tokens(body: Any) -> int:
    usage = getattr(body, "usage", None)
    return int(getattr(usage, "completion_tokens", None) or 0)


def _error_text(exc) -> str:
    """The server's own message (OpenAI-style ``{"error": {"message": ...}}``), not the client's wrapper."""
    body = exc.body
    if isinstance(body, dict):
        return str(body.get("message") or body)[:300]
    if body:
        return str(body)[:300]
    return exc.response.text[:300].strip() or exc.response.reason_phrase
