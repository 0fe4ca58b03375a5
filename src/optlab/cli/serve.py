"""`optlab serve`: the built-in reference image classifier as an HTTP service."""

from __future__ import annotations

import typing
from typing import Any

import click

from optlab.config.knobs import BuiltinKnobs


def _choices(knob: str) -> click.Choice[str]:
    return click.Choice(
        [str(v) for v in typing.get_args(BuiltinKnobs.model_fields[knob].annotation)]
    )


def _default(knob: str) -> Any:
    value = BuiltinKnobs.model_fields[knob].default
    return getattr(value, "mode", value)


GROUP_HELP = (
    "a mode word ({modes}: that mode's defaults) or the group as a JSON object, e.g. '{example}'"
)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="TCP port to listen on.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Threads running the blocking pipeline; dynamic batching needs many.",
)
@click.option("--access-log", is_flag=True, help="Log one line per request to stderr.")
@click.option(
    "--engine",
    type=_choices("engine"),
    default=_default("engine"),
    show_default=True,
    help="Inference engine.",
)
@click.option(
    "--precision",
    type=_choices("precision"),
    default=_default("precision"),
    show_default=True,
    help="Model precision.",
)
@click.option(
    "--preprocess",
    type=_choices("preprocess"),
    default=_default("preprocess"),
    show_default=True,
    help="Preprocess variant.",
)
@click.option(
    "--threads",
    type=int,
    default=_default("threads"),
    show_default=True,
    help="Intra-op threads of the engine.",
)
@click.option(
    "--instances",
    type=int,
    default=_default("instances"),
    show_default=True,
    help="Model instances serving in parallel.",
)
@click.option(
    "--device",
    type=_choices("device"),
    default=_default("device"),
    show_default=True,
    help="Device the model runs on.",
)
@click.option(
    "--batching",
    default=_default("batching"),
    show_default=True,
    metavar="MODE|JSON",
    help="Dynamic batching: "
    + GROUP_HELP.format(
        modes="off, dynamic", example='{"mode":"dynamic","max_batch_size":8,"max_wait_ms":2}'
    ),
)
@click.option(
    "--cache",
    default=_default("cache"),
    show_default=True,
    metavar="MODE|JSON",
    help="Response cache: "
    + GROUP_HELP.format(modes="off, lru", example='{"mode":"lru","max_entries":1024}'),
)
def serve(
    host: str,
    port: int,
    workers: int,
    access_log: bool,
    **knob_options: Any,
) -> None:
    """Serve the built-in reference image classifier over HTTP until SIGTERM or Ctrl-C.

    The knob options are the reference target's knobs (defaults as in experiment files).
    POST /predict takes JPEG bytes and answers the pipeline's JSON with a Server-Timing
    header (the pipeline's stages and `app`, in ms); GET /health, GET /metrics,
    POST /metrics/reset and GET /accuracy report on the service. Prints
    `optlab serve: listening on http://HOST:PORT` once ready.
    """
    from optlab.reference.serve import serve as run_service
    from optlab.reference.serve_knobs import assemble_knobs

    knobs = assemble_knobs(knob_options)
    run_service(knobs, host=host, port=port, workers=workers, access_log=access_log)
