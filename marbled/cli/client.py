"""A small JSON client for the broker's API over its Unix socket (standard library only)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit


class BrokerUnreachable(RuntimeError):
    pass


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.field = field


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class BrokerClient:
    """The broker's API on its Unix socket, or with `url` on its TCP listener (`token`)."""

    def __init__(self, socket_path: Path | None = None, timeout: float = 30.0,
                 url: str | None = None, token: str | None = None):
        self.socket_path = Path(socket_path) if socket_path else None
        self.timeout = timeout
        self.url = urlsplit(url) if url else None
        self.token = token

    @property
    def where(self) -> str:
        return self.url.geturl() if self.url else str(self.socket_path)

    def _connection(self) -> http.client.HTTPConnection:
        if self.url:
            return http.client.HTTPConnection(self.url.hostname, self.url.port or 80,
                                              timeout=self.timeout)
        return _UnixConnection(str(self.socket_path), self.timeout)

    def request(self, method: str, path: str, body: object | None = None) -> dict:
        conn = self._connection()
        try:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise BrokerUnreachable(
                f"no broker listens on {self.where} ({exc.strerror}); start one with "
                "'marbled', or point MARBLE_STATE_DIR / --state-dir at its state directory"
            ) from None
        finally:
            conn.close()
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {"error": raw.decode(errors="replace")}
        if resp.status >= 400:
            raise ApiError(resp.status, doc.get("error", resp.reason), doc.get("field"))
        return doc

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
