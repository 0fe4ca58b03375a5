"""The reference image classifier as an HTTP service (`optlab serve`).

`POST /predict` takes JPEG bytes and answers with the pipeline's JSON, plus a W3C
`Server-Timing` header: the pipeline's own stages (`preprocess`, `queue`, `infer`,
`postprocess`, named as the pipeline names them) and `app`, the whole handler. The pipeline
blocks, so each call runs on a thread pool: dynamic batching can only form batches when many
requests are inside the pipeline at once, hence the large default pool.

The pipeline is built before the port is bound, so `GET /health` answering means ready.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import json
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from optlab.errors import ConfigError, OptlabError
from optlab.metrics.stages import CURRENT, RequestTiming
from optlab.reference.classifier.batcher import BatcherClosed, Overloaded
from optlab.reference.serve_knobs import knobs_summary

__all__ = ["DEFAULT_WORKERS", "Pipeline", "make_app", "serve", "server_timing"]

DEFAULT_WORKERS = 64
# Requests larger than aiohttp's 1 MiB default are legitimate here: a 2048 px JPEG of noise.
MAX_BODY = 64 * 1024 * 1024
# In-flight requests get this long to finish after SIGTERM; a slow /accuracy may need it.
SHUTDOWN_TIMEOUT_S = 60.0
JPEG_MAGIC = b"\xff\xd8\xff"

log = logging.getLogger("optlab.reference.serve")


class Pipeline(Protocol):
    """What the service needs of `optlab.reference.pipeline.ImageClassifier`."""

    def __call__(self, request: bytes) -> bytes: ...

    def metrics(self) -> dict[str, Any]: ...

    def reset_metrics(self) -> None: ...

    def accuracy(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


PIPELINE = web.AppKey("pipeline", Pipeline)
EXECUTOR = web.AppKey("executor", concurrent.futures.ThreadPoolExecutor)


# -- the application --------------------------------------------------------------------------
def server_timing(stages: dict[str, int] | None, app_ns: int) -> str:
    """The `Server-Timing` header value: each stage in ms (3 decimals), then `app`."""
    entries = [f"{name};dur={ns / 1e6:.3f}" for name, ns in (stages or {}).items()]
    entries.append(f"app;dur={app_ns / 1e6:.3f}")
    return ", ".join(entries)


def _timed_call(pipeline: Pipeline, body: bytes) -> tuple[bytes, dict[str, int] | None]:
    """On a worker thread: the pipeline's stage() calls time into this request's timing."""
    timing = RequestTiming()
    token = CURRENT.set(timing)
    try:
        return pipeline(body), timing.stages
    finally:
        # Pool threads are reused: the next request must not inherit this one's timing.
        CURRENT.reset(token)


def _error(status: int, message: str) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps({"error": message}).encode(),
        content_type="application/json",
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


async def _predict(request: web.Request) -> web.Response:
    started = time.perf_counter_ns()
    body = await request.read()
    if not body:
        return _error(400, "empty body: send the bytes of a JPEG image")
    if not body.startswith(JPEG_MAGIC):
        return _error(400, "the body is not a JPEG image (no JPEG start-of-image marker)")
    app = request.app
    loop = asyncio.get_running_loop()
    try:
        response, stages = await loop.run_in_executor(
            app[EXECUTOR], _timed_call, app[PIPELINE], body
        )
    except (Overloaded, BatcherClosed) as exc:
        return _error(503, _one_line(exc.message))
    except OptlabError as exc:
        # The pipeline's own user-facing errors are about the payload (a JPEG PIL cannot decode).
        return _error(400, _one_line(exc.message))
    except Exception as exc:
        log.error(
            "optlab serve: POST /predict failed: %s: %s", type(exc).__name__, _one_line(str(exc))
        )
        return _error(500, f"internal error: {type(exc).__name__}")
    headers = {"Server-Timing": server_timing(stages, time.perf_counter_ns() - started)}
    return web.Response(body=response, content_type="application/json", headers=headers)


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def _json(value: Any) -> web.Response:
    return web.Response(
        body=json.dumps(value, default=str).encode(), content_type="application/json"
    )


async def _call(request: web.Request, what: str, fn: Callable[[], Any]) -> web.Response:
    loop = asyncio.get_running_loop()
    try:
        value = await loop.run_in_executor(request.app[EXECUTOR], fn)
    except Exception as exc:
        log.error("optlab serve: %s failed: %s: %s", what, type(exc).__name__, _one_line(str(exc)))
        return _error(500, f"internal error: {type(exc).__name__}")
    return _json(value) if value is not None else web.Response(status=204)


async def _metrics(request: web.Request) -> web.Response:
    return await _call(request, "GET /metrics", request.app[PIPELINE].metrics)


async def _reset_metrics(request: web.Request) -> web.Response:
    return await _call(request, "POST /metrics/reset", request.app[PIPELINE].reset_metrics)


async def _accuracy(request: web.Request) -> web.Response:
    # Slow (the whole held-out check): on the pool, so the loop keeps serving meanwhile.
    return await _call(request, "GET /accuracy", request.app[PIPELINE].accuracy)


async def _shutdown_executor(app: web.Application) -> None:
    # After aiohttp has waited for the in-flight handlers; a handler it gave up on may still
    # hold a thread, which this waits for, so the pipeline is closed only when nothing uses it.
    await asyncio.get_running_loop().run_in_executor(None, app[EXECUTOR].shutdown, True)


def make_app(pipeline: Pipeline, workers: int = DEFAULT_WORKERS) -> web.Application:
    """The service around a built pipeline; its thread pool is shut down on app cleanup.

    The pipeline is not closed here: its owner (`serve`) closes it after the app is cleaned up.
    """
    if workers < 1:
        raise ConfigError(f"--workers {workers} is invalid", hint="give at least 1 worker thread")
    app = web.Application(client_max_size=MAX_BODY)
    app[PIPELINE] = pipeline
    app[EXECUTOR] = concurrent.futures.ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix="optlab-serve"
    )
    app.router.add_post("/predict", _predict)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/metrics/reset", _reset_metrics)
    app.router.add_get("/accuracy", _accuracy)
    app.on_cleanup.append(_shutdown_executor)
    return app


# -- lifecycle --------------------------------------------------------------------------------
def _in_use(host: str, port: int) -> OptlabError:
    return OptlabError(
        f"port {port} on {host} is already in use",
        hint="stop the other service or choose another --port",
    )


def check_port(host: str, port: int) -> None:
    """Fail early, before the (slow) pipeline build, if the address cannot be bound.

    A bind attempt, not a connect: a connect cannot tell a free port from a firewalled one.
    SO_REUSEADDR as aiohttp sets it, so a port in TIME_WAIT is not reported as taken.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OptlabError(
            f"cannot resolve --host {host!r}: {exc.strerror}",
            hint="give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0",
        ) from exc
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise _bind_error(host, port, exc) from exc


def _bind_error(host: str, port: int, exc: OSError) -> OptlabError:
    if exc.errno == errno.EADDRINUSE:
        return _in_use(host, port)
    return OptlabError(
        f"cannot listen on {host}:{port}: {exc.strerror or exc}",
        hint="choose another --host or --port (ports below 1024 need privileges)",
    )


def _configure_logging(access_log: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in ("optlab.reference.serve", "aiohttp.server", "aiohttp.web") + (
        ("aiohttp.access",) if access_log else ()
    ):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


async def _serve_app(
    app: web.Application,
    host: str,
    port: int,
    access_log: bool,
    announce: Callable[[str], None],
) -> None:
    runner = web.AppRunner(
        app,
        access_log=logging.getLogger("aiohttp.access") if access_log else None,
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise _bind_error(host, port, exc) from exc
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        announce(f"optlab serve: listening on http://{_url_host(host)}:{port}")
        await stop.wait()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    finally:
        # Stops accepting, waits for in-flight requests, then runs on_cleanup (the pool).
        await runner.cleanup()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _announce(line: str) -> None:
    print(line, flush=True)


def serve(
    knobs: dict[str, Any],
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = DEFAULT_WORKERS,
    access_log: bool = False,
    *,
    announce: Callable[[str], None] = _announce,
) -> None:
    """Build the pipeline, serve it on host:port until SIGTERM or SIGINT, shut down cleanly.

    Blocking. Prints `optlab serve: building ...` to stderr and, once the port is bound,
    `optlab serve: listening on http://HOST:PORT` through `announce` (stdout, flushed).
    """
    from optlab.reference.pipeline import build

    if workers < 1:
        raise ConfigError(f"--workers {workers} is invalid", hint="give at least 1 worker thread")
    check_port(host, port)
    _configure_logging(access_log)
    print(f"optlab serve: building {knobs_summary(knobs)}", file=sys.stderr, flush=True)
    pipeline = build(knobs)
    try:
        app = make_app(pipeline, workers)
        asyncio.run(_serve_app(app, host, port, access_log, announce))
    finally:
        pipeline.close()
