"""A small OpenAI-compatible HTTP client: stdlib `http.client`, one kept-alive connection per
worker thread, timeouts and retries, and a clock of the time the server kept us waiting.

Only the URL the user gave is contacted (its scheme, host, port and path prefix, plus `/metrics`
beside its `/v1` unless --metrics off); the API key is
sent as a Bearer header and never stored anywhere else.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from specviz.errors import SpecvizError
from specviz.probe.prompts import Prompt
from specviz.probe.responses import Answer, ResponseError, parse_answer

MAX_RESPONSE_BYTES = 32 * 1024 * 1024
RETRY_STATUSES = (429, 500, 502, 503, 504)


class ServerError(SpecvizError):
    """A server that cannot be reached or does not answer as an OpenAI-compatible one."""


@dataclass(frozen=True)
class Endpoint:
    """Where to send requests: the `/v1` base of one server, as the user named it."""

    scheme: str
    host: str
    port: int
    base_path: str  # e.g. "/v1" or "/numerical/legacy/v1"

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerError(f"{redact(url)}: not an http(s) URL")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ServerError(f"{redact(url)}: bad port") from None
        path = parts.path.rstrip("/")
        for suffix in ("/chat/completions", "/completions"):
            if path.endswith(suffix):
                path = path[: -len(suffix)]
        if not path.endswith("/v1"):
            path += "/v1"
        return cls(parts.scheme, parts.hostname, port, path)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.base_path}"


def redact(url: str) -> str:
    """The URL without user:password@ or a query string (either may carry a credential)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class InFlightClock:
    """Wall time with at least one request outstanding (shared by every client of a run)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outstanding = 0
        self._since = 0.0
        self.busy_s = 0.0
        self.requests = 0

    def start(self) -> None:
        with self._lock:
            if self._outstanding == 0:
                self._since = time.perf_counter()
            self._outstanding += 1

    def stop(self, counted: bool = True) -> None:
        with self._lock:
            self._outstanding -= 1
            self.requests += counted
            if self._outstanding == 0:
                self.busy_s += time.perf_counter() - self._since


class Client:
    """Sends greedy completion requests to one endpoint; thread-safe (a connection per thread)."""

    def __init__(
        self,
        endpoint: Endpoint,
        kind: str,  # "completions" or "chat"
        model: str | None,
        max_tokens: int,
        logprobs: int,
        api_key: str | None,
        clock: InFlightClock,
        timeout_s: float = 120.0,
        retries: int = 2,
    ) -> None:
        self.endpoint, self.kind, self.model = endpoint, kind, model
        self.max_tokens, self.logprobs = max_tokens, logprobs
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.clock, self.timeout_s, self.retries = clock, timeout_s, retries
        self._local = threading.local()
        self.logprobs_refused = False  # the server refused logprobs once: asked without them since
        self.cache_flag_refused = False  # the server refused `cache_prompt`: asked without it since

    # -- requests -----------------------------------------------------------------------------

    def discover_model(self) -> str | None:
        """The first model `/v1/models` lists (None if the server does not say)."""
        card = self.model_card()
        return card["id"] if isinstance(card.get("id"), str) else None

    def model_card(self) -> dict[str, Any]:
        """`/v1/models`' entry for this client's model (or its first one); {} if it lists none.
        Untrusted: callers check each field's type."""
        status, payload = self._request("GET", "/models", None)
        if status != 200 or not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
            return {}
        cards = [item for item in payload["data"] if isinstance(item, dict) and isinstance(item.get("id"), str)]
        return next((c for c in cards if c["id"] == self.model), cards[0] if cards else {})

    def scrape_metrics(self) -> str | None:
        """The server's Prometheus text at `<root>/metrics` (the URL's path without `/v1`: where
        vLLM and SGLang serve it); None when there is none or it cannot be read. Its wait is
        server time, but it is not counted as a request (it is not a completion)."""
        path = self.endpoint.base_path.removesuffix("/v1") + "/metrics"
        self.clock.start()
        try:
            status, raw = self._send("GET", path, None)
        except (OSError, http.client.HTTPException, ServerError):
            self._drop_connection()
            return None
        finally:
            self.clock.stop(counted=False)
        if status != 200:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def complete(self, prompt: Prompt, max_tokens: int | None = None, fresh: bool = False) -> Answer:
        """`fresh`: ask the server to compute the whole prompt, not reuse a cached prefix
        (llama.cpp's `cache_prompt: false`; a server that refuses the field is asked without it,
        and says in its answer whether it reused a cache: `Answer.cached`)."""
        body = self._body(prompt, with_logprobs=self.logprobs > 0 and not self.logprobs_refused)
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        path = "/chat/completions" if self.kind == "chat" else "/completions"
        if fresh and not self.cache_flag_refused:
            status, payload = self._request("POST", path, {**body, "cache_prompt": False})
            if status not in (400, 422):
                return self._answer(status, payload, path)
            self.cache_flag_refused = True
        status, payload = self._request("POST", path, body)
        if status in (400, 422) and "logprobs" in body:  # e.g. `transformers serve` on chat
            self.logprobs_refused = True
            body = {**self._body(prompt, with_logprobs=False), "max_tokens": body["max_tokens"]}
            status, payload = self._request("POST", path, body)
        return self._answer(status, payload, path)

    def _answer(self, status: int, payload: Any, path: str) -> Answer:
        if status != 200:
            raise ServerError(f"{self.endpoint.url}{path}: HTTP {status} ({_error_message(payload)})")
        try:
            return parse_answer(payload, self.kind)
        except ResponseError as exc:
            raise ServerError(f"{self.endpoint.url}{path}: {exc}") from None

    def _body(self, prompt: Prompt, with_logprobs: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": 0.0, "top_p": 1.0, "n": 1}
        if self.model:
            body["model"] = self.model
        if self.kind == "chat":
            body["messages"] = prompt.as_messages()
            if with_logprobs:
                body["logprobs"] = True
                body["top_logprobs"] = self.logprobs
        else:
            body["prompt"] = prompt.as_text()
            if with_logprobs:
                body["logprobs"] = self.logprobs
        return body

    def _request(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.25 * 2**attempt, 4.0))
            self.clock.start()
            try:
                status, raw = self._send(method, self.endpoint.base_path + path, data)
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                last = _describe(exc)
                continue
            finally:
                self.clock.stop()
            if status in RETRY_STATUSES and attempt < self.retries:
                last = f"HTTP {status}"
                continue
            try:
                return status, json.loads(raw) if raw else None
            except (ValueError, RecursionError):
                if status == 200:
                    raise ServerError(f"{self.endpoint.url}{path}: response is not JSON") from None
                return status, None
        tries = self.retries + 1
        raise ServerError(f"{self.endpoint.url}: unreachable after {tries} tries ({last})")

    # -- connections ----------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self.endpoint.scheme == "https" else http.client.HTTPConnection
            conn = cls(self.endpoint.host, self.endpoint.port, timeout=self.timeout_s)
            self._local.conn = conn
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _send(self, method: str, path: str, data: bytes | None) -> tuple[int, bytes]:
        conn = self._connection()
        try:
            conn.request(method, path, body=data, headers=self._headers)
            response = conn.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            # A kept-alive connection the server closed meanwhile: one fresh try, not a retry.
            self._drop_connection()
            conn = self._connection()
            conn.request(method, path, body=data, headers=self._headers)
            response = conn.getresponse()
        raw = response.read(MAX_RESPONSE_BYTES + 1)
        if len(raw) > MAX_RESPONSE_BYTES:
            self._drop_connection()
            raise ServerError(f"{self.endpoint.url}{path}: response over {MAX_RESPONSE_BYTES} bytes")
        if response.getheader("Connection", "").lower() == "close":
            self._drop_connection()
        return response.status, raw

    def close(self) -> None:
        self._drop_connection()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _error_message(payload: Any) -> str:
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail", payload.get("message")))
        if isinstance(error, dict):
            error = error.get("message")
        if isinstance(error, str) and error:
            line = error.strip().splitlines()[0] if error.strip() else error
            return line[:200]
    return "no error message"
