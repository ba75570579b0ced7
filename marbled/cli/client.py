"""A small JSON client for the broker's API over its Unix socket (standard library only).

It speaks just the HTTP/1.1 it needs (one request per connection, `Connection: close`)
over a plain socket: `http.client` and what it imports (email, ssl) would be a fifth of
the time a `marble submit` takes."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

IDEMPOTENCY_HEADER = "Idempotency-Key"  # as marbled.api.openapi names it (not imported: aiohttp)
MAX_WAIT_JOBS = 300  # GET /v1/wait's most `job`s, as marbled.api.openapi has it (tests agree)
SUBMIT_RETRIES = 3  # `marble submit` sends a submission again at most this many times


class BrokerUnreachable(RuntimeError):
    pass


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.field = field


def __getattr__(name: str):
    if name == "_UnixConnection":  # for tests that send raw requests: http.client on demand
        import http.client

        class _UnixConnection(http.client.HTTPConnection):
            def __init__(self, path: str, timeout: float):
                super().__init__("localhost", timeout=timeout)
                self._path = path

            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(self.timeout)
                self.sock.connect(self._path)

        globals()[name] = _UnixConnection
        return _UnixConnection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _response(sock: socket.socket) -> tuple[int, str, bytes]:
    """Read one HTTP/1.1 response to its end: status, reason, body. A body of a known
    length is done once it has come, without waiting for the broker to close the
    connection, which it does a round of its loop later (after the decision that a
    submission wakes: 2.5 ms of a `marble submit`)."""
    raw, head, length = bytearray(), None, None  # appended in place: linear in its size
    while True:
        if head is None and b"\r\n\r\n" in raw:
            head, _, _ = raw.partition(b"\r\n\r\n")
            length = _content_length(bytes(head))
        if length is not None and len(raw) - len(head) - 4 >= length:
            break
        chunk = sock.recv(65536)
        if not chunk:
            break
        raw += chunk
    head, sep, body = bytes(raw).partition(b"\r\n\r\n")
    if not sep:
        raise ConnectionError("the broker closed the connection before answering")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status, reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _unchunk(body)
    elif "content-length" in headers:
        body = body[:int(headers["content-length"])]
    return status, reason, body


def _answer(sock: socket.socket) -> dict:
    """The JSON document of the response on `sock`; ApiError for a refusal."""
    status, reason, raw = _response(sock)
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        doc = {"error": raw.decode(errors="replace")}
    if status >= 400:
        raise ApiError(status, doc.get("error", reason), doc.get("field"))
    return doc


def _content_length(head: bytes) -> int | None:
    """The Content-Length of a response's head; None if it has none, or is chunked."""
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return None
        if name == b"content-length" and value.strip().isdigit():
            length = int(value)
    return length


def _unchunk(data: bytes) -> bytes:
    out, pos = [], 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(data[end + 2:end + 2 + size])
        pos = end + 2 + size + 2


class BrokerClient:
    """The broker's API on its Unix socket, or with `url` on its TCP listener (`token`)."""

    def __init__(self, socket_path: Path | None = None, timeout: float = 30.0,
                 url: str | None = None, token: str | None = None):
        self.socket_path = Path(socket_path) if socket_path else None
        self.timeout = timeout
        if url:
            from urllib.parse import urlsplit  # only for a TCP listener

            self.url = urlsplit(url)
        else:
            self.url = None
        self.token = token

    @property
    def where(self) -> str:
        return self.url.geturl() if self.url else str(self.socket_path)

    def _connect(self) -> socket.socket:
        if self.url:
            return socket.create_connection((self.url.hostname, self.url.port or 80),
                                            timeout=self.timeout)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(str(self.socket_path))
        except BaseException:
            sock.close()
            raise
        return sock

    def request(self, method: str, path: str, body: object | None = None,
                extra: dict[str, str] | None = None) -> dict:
        """`extra`: more headers to send."""
        sock = self._send(method, path, body, extra)
        try:
            return _answer(sock)
        finally:
            sock.close()

    def get_many(self, paths: list[str]) -> list[dict]:
        """GET each of `paths` at once, each on a connection of its own: the broker answers
        them in the same rounds of its loop, so a busy broker's wait is paid once, not once
        a request. The first refusal, in the order of `paths`, is raised."""
        socks: list[socket.socket] = []
        try:
            for path in paths:
                socks.append(self._send("GET", path))
            return [_answer(sock) for sock in socks]
        finally:
            for sock in socks:
                sock.close()

    def _send(self, method: str, path: str, body: object | None = None,
              extra: dict[str, str] | None = None) -> socket.socket:
        """A connection with the request sent on it, for `_answer`."""
        headers = f"Authorization: Bearer {self.token}\r\n" if self.token else ""
        headers += "".join(f"{name}: {value}\r\n" for name, value in (extra or {}).items())
        data = b""
        if body is not None:
            data = json.dumps(body).encode()
            headers += "Content-Type: application/json\r\n"
        host = self.url.netloc if self.url else "localhost"
        message = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
                   f"Accept: application/json\r\n{headers}Content-Length: {len(data)}\r\n"
                   "\r\n").encode() + data
        try:
            sock = self._connect()
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise BrokerUnreachable(
                f"no broker listens on {self.where} ({exc.strerror}); start one with "
                "'marbled', or point MARBLE_STATE_DIR / --state-dir at its state directory"
            ) from None
        try:
            sock.sendall(message)
        except BaseException:
            sock.close()
            raise
        return sock

    def submit(self, body: object, retries: int = SUBMIT_RETRIES,
               on_retry: Callable[[str], None] = lambda message: None,
               key: str | None = None) -> dict:
        """POST /v1/jobs with an Idempotency-Key new to this call: when no answer comes (a
        timeout, a connection reset or closed before the answer), the same request is sent
        again with the same key, up to `retries` more times (`on_retry` says so), and the
        broker answers a retry with the jobs of the first (200), never submitting twice.
        `key`: this key instead of a new one (a part of a large job set, sent again by a
        later `marble submit` of the same file: marbled.cli.chunks)."""
        # secrets.token_hex's own bytes, without the 3 ms of importing secrets (hmac, random)
        key = key or os.urandom(16).hex()
        for attempt in range(retries + 1):
            try:
                return self.request("POST", "/v1/jobs", body, {IDEMPOTENCY_HEADER: key})
            except (TimeoutError, ConnectionError) as exc:  # a reset, a broken pipe, ...
                what = f"no answer within {self.timeout:g} s" \
                    if isinstance(exc, TimeoutError) else f"the connection failed ({exc})"
                if attempt == retries:
                    raise BrokerUnreachable(
                        f"the broker on {self.where} gave {what}, {retries + 1} times; the "
                        "jobs may have been submitted: see 'marble status'") from None
                on_retry(f"{what} from the broker; sending the submission again with the "
                         f"same {IDEMPOTENCY_HEADER} (it cannot be submitted twice), "
                         f"try {attempt + 2} of {retries + 1}")
                time.sleep(min(0.5 * 2 ** attempt, 4.0))
        raise AssertionError("unreachable")

    def get(self, path: str) -> dict:
        return self.request("GET", path)

    def post(self, path: str, body: object | None = None) -> dict:
        return self.request("POST", path, {} if body is None else body)


def wait_until_serving(client: BrokerClient, proc, timeout: float = 60.0) -> dict:
    """Wait until the broker process `proc` (a Popen) answers on its socket; its status.

    Raises RuntimeError if `proc` exits first or does not answer within `timeout`.
    An answer from another process (a stale broker) does not count.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"marbled exited at start-up with code {proc.returncode}")
        try:
            status = client.get("/v1/status")
            if status.get("pid") == proc.pid:
                return status
        except (BrokerUnreachable, OSError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"marbled did not answer within {timeout:g} s")
