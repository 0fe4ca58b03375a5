"""An HTTP service whose throughput swings ±25% at random with nothing else running.

    python swinging_service.py --port 8123 [--base-ms 10] [--swing 0.25] [--hold-s 1] [--seed 7]

Every request sleeps `--base-ms` divided by a speed factor (asyncio: requests overlap, so the
service has no queue of its own), and the factor is drawn anew, uniform in [1 - swing,
1 + swing], after a hold of exponential length (mean `--hold-s`). Under a closed loop its
per-second QPS then swings ±25% around clients x 1000 / base-ms, as a batching server's or a
garbage-collected one's does on a quiet machine, while the service never changes: two runs
of it are an A/A pair. `/health` answers 200; `/speed` the factor in force.
"""

from __future__ import annotations

import argparse
import asyncio
import random

from aiohttp import web


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--base-ms", type=float, default=10.0)
    parser.add_argument("--swing", type=float, default=0.25)
    parser.add_argument("--hold-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    state = {"speed": 1.0}

    async def swing() -> None:
        while True:
            state["speed"] = rng.uniform(1 - args.swing, 1 + args.swing)
            await asyncio.sleep(rng.expovariate(1 / args.hold_s))

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(args.base_ms / state["speed"] / 1000)
        return web.Response(text="ok")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def speed(request: web.Request) -> web.Response:
        return web.json_response({"speed": state["speed"]})

    async def start(app: web.Application) -> None:
        app["swing"] = asyncio.create_task(swing())

    app = web.Application()
    app.on_startup.append(start)
    app.router.add_get("/health", health)
    app.router.add_get("/speed", speed)
    app.router.add_route("*", "/", handle)
    # SIGTERM (optlab stopping the service) ends it cleanly: run_app's own handler.
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
