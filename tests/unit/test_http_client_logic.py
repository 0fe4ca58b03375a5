"""The HTTP/1.1 client's pure parts: the request bytes built once per body, headers refused
before they could break a request, the Server-Timing fast path against the entry-by-entry parser,
and the error names stored runs use (no server, no event loop)."""

from __future__ import annotations

import random

import pytest

from optlab.errors import ConfigError
from optlab.targets.http import classify
from optlab.targets.http_wire import (
    Body,
    ClientResponseError,
    ServerDisconnectedError,
    request_bytes,
)
from optlab.targets.server_timing import parse_server_timing, split_server_timing
from tests.support.httpspec import spec


def test_each_body_becomes_one_prebuilt_request() -> None:
    headers = (("Authorization", "Bearer t"), ("User-Agent", "mine"), ("Content-Type", "x/y"))
    built = request_bytes(
        spec(8080, headers=headers),
        [Body(b'{"a":1}', "application/json"), Body(b"", None)],
    )
    head, _, body = built[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /p?q=1 HTTP/1.1"
    assert body == b'{"a":1}'
    assert "Host: 127.0.0.1:8080" in lines
    assert "Authorization: Bearer t" in lines
    assert "User-Agent: mine" in lines  # the target's own wins over the default
    assert "Content-Type: application/json" in lines  # the body's type wins, as before
    assert "Content-Length: 7" in lines
    assert "Accept: */*" in lines
    # A POST without a body still says so; a GET without one sends no length.
    assert b"Content-Length: 0\r\n" in built[1]
    get = request_bytes(spec(80, method="GET", url="http://h/"), [Body(b"", None)])[0]
    assert get.startswith(b"GET / HTTP/1.1\r\nHost: h\r\n") and b"Content-Length" not in get


def test_a_header_that_would_break_the_request_is_refused() -> None:
    with pytest.raises(ConfigError, match="target.headers.X"):
        request_bytes(spec(80, headers=(("X", "a\r\nInjected: 1"),)), [Body(b"", None)])
    with pytest.raises(ConfigError, match="not http or https"):
        request_bytes(spec(80, url="ftp://h/"), [Body(b"", None)])


def test_server_timing_fast_path_reads_as_the_entry_by_entry_parser() -> None:
    atoms = ["a", "db", "total", " ", ";", ",", "dur", "DUR", "=", "1", "2.5", ".5", "1e3",
             "desc", "x y", "\t", ";dur=3", "durx=1", "é"]  # fmt: skip
    rng = random.Random(7)
    for _ in range(3000):
        value = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 10)))
        slow: dict[str, int] = {}
        for name, ms in split_server_timing(value):
            name = "server_total" if name == "total" else name
            slow[name] = slow.get(name, 0) + round(float(ms) * 1e6)
        assert parse_server_timing([value]) == slow, value


def test_errors_keep_their_former_names() -> None:
    # Runs stored before this client used aiohttp's names; the error table reads alike.
    assert classify(ServerDisconnectedError("x"))[0] == "ServerDisconnectedError"
    assert classify(ClientResponseError("x"))[0] == "ClientResponseError"
    assert classify(TimeoutError())[0] == "timeout"
