"""A small HTTP service for the tests: real sockets, real process, knobs from argv and env.

    python toy_service.py --port 8123 [--delay-ms 2] [--pid-file F] [--fail-every N]

POST or GET / sleeps `--delay-ms` (or env TOY_DELAY_MS), then answers 200 "ok" with a
Server-Timing header (`queue`, `work`, and a `total` that the client must not take as its
own). Every `--fail-every`-th request answers 503. `/health` answers 200; `/metrics`,
`/metrics/reset` and `/accuracy` answer like `optlab serve`'s (a fixed accuracy 2.5 points
below its reference). It prints the Authorization header it receives and the env var
TOY_SECRET on stdout (a careless service logging a secret: optlab must redact it), and echoes
Authorization back in a 401 body when the request path is /echo.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from aiohttp import web


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=None)
    parser.add_argument("--pid-file")
    parser.add_argument("--fail-every", type=int, default=0)
    # One request at a time: a service of known capacity (1000 / delay-ms requests/s) that
    # an open loop above that rate saturates.
    parser.add_argument("--serial", action="store_true")
    args = parser.parse_args()
    delay_ms = args.delay_ms
    if delay_ms is None:
        delay_ms = float(os.environ.get("TOY_DELAY_MS", "1"))
    if args.pid_file:
        with open(args.pid_file, "w") as handle:
            handle.write(str(os.getpid()))
    print(f"toy service: secret from env is {os.environ.get('TOY_SECRET', '-')}", flush=True)
    count = 0
    one_at_a_time = asyncio.Lock()

    async def handle(request: web.Request) -> web.Response:
        nonlocal count
        started = time.perf_counter()
        count += 1
        await request.read()
        if count == 1:
            print(
                f"toy service: first request, auth {request.headers.get('Authorization')}",
                flush=True,
            )
        if request.path == "/echo":
            auth = request.headers.get("Authorization")
            return web.Response(status=401, text=f"bad token {auth}")
        if args.fail_every and count % args.fail_every == 0:
            return web.Response(status=503, text="overloaded")
        queue_ms = 0.1
        if args.serial:
            async with one_at_a_time:
                await asyncio.sleep(delay_ms / 1000)
        else:
            await asyncio.sleep(delay_ms / 1000)
        total_ms = (time.perf_counter() - started) * 1000
        timing = (
            f'queue;dur={queue_ms}, work;dur={delay_ms};desc="sleep, then answer", '
            f"total;dur={total_ms:.3f}"
        )
        return web.Response(text="ok", headers={"Server-Timing": timing})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    since_reset = 0

    async def metrics(request: web.Request) -> web.Response:
        return web.json_response({"requests": count - since_reset, "served_by": "toy"})

    async def reset(request: web.Request) -> web.Response:
        nonlocal since_reset
        since_reset = count
        return web.Response(status=204)

    async def accuracy(request: web.Request) -> web.Response:
        # A model that lost 2.5 points against its reference: the run must be INVALID.
        return web.json_response({"top1": 0.61, "drop_pts": 2.5, "n": 100})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/metrics/reset", reset)
    app.router.add_get("/accuracy", accuracy)
    app.router.add_route("*", "/{tail:.*}", handle)
    print(f"toy service: listening on {args.port} with delay {delay_ms} ms", flush=True)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)
    print("toy service: stopped cleanly", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
