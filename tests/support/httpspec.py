"""The HTTP client's settings for a server on 127.0.0.1 (optlab.targets.http_wire.HttpSpec), with
the fields a test changes given by name, and the smallest successful answer."""

from __future__ import annotations

from typing import Any

from optlab.targets.http_wire import HttpSpec

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def spec(port: int, **changes: Any) -> HttpSpec:
    fields: dict[str, Any] = {
        "url": f"http://127.0.0.1:{port}/p?q=1",
        "method": "POST",
        "headers": (),
        "ok_status": None,
        "connect_timeout_s": 2.0,
        "timeout_s": 5.0,
        "connections": 4,
    }
    fields.update(changes)
    return HttpSpec(**fields)
