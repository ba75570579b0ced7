"""The small client's reading of a response (`marbled.cli.client._response`), on a real
socket pair: a body of a known length is done once it has come, without waiting for the
server to close the connection (a broker closes it a round of its loop later); a body
without a length, or chunked, is read to the close."""

from __future__ import annotations

import socket
import threading

import pytest

from marbled.cli.client import _response

pytestmark = pytest.mark.core


def answer(*pieces: bytes, close: bool) -> tuple[int, str, bytes]:
    ours, theirs = socket.socketpair()
    ours.settimeout(5)

    def serve() -> None:
        for piece in pieces:
            theirs.sendall(piece)
        if close:
            theirs.close()

    server = threading.Thread(target=serve)
    server.start()
    try:
        return _response(ours)
    finally:
        server.join()
        ours.close()
        if not close:
            theirs.close()


def test_a_body_of_known_length_needs_no_close():
    """The connection stays open: before, the client waited for the close (here: its
    timeout, a TimeoutError)."""
    assert answer(b"HTTP/1.1 201 Created\r\nContent-Length: 12\r\n", b"\r\n{\"jobs\":",
                  b" []}", close=False) == (201, "Created", b'{"jobs": []}')


def test_an_empty_body_of_known_length():
    assert answer(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n",
                  close=False) == (204, "No Content", b"")


def test_without_a_length_the_body_runs_to_the_close():
    assert answer(b"HTTP/1.1 200 OK\r\n\r\n", b"{}", b"\n", close=True) == (200, "OK", b"{}\n")


def test_a_chunked_body_is_read_to_the_close_and_joined():
    assert answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                  b"2\r\n{}\r\n", b"0\r\n\r\n", close=True) == (200, "OK", b"{}")


def test_a_close_before_the_head_is_an_error():
    with pytest.raises(ConnectionError):
        answer(b"HTTP/1.1 200 OK\r\n", close=True)
