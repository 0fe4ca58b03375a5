"""`optlab serve`'s knob options: the reference target's knobs from the command line.

A group knob (`--batching`, `--cache`) is a mode word or the group as JSON, exactly as an
experiment's knob template renders it; everything is validated against `BuiltinKnobs`, so the
service takes the same knobs an experiment file does.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from optlab.config.knobs import BuiltinKnobs
from optlab.errors import ConfigError

__all__ = ["GROUP_KNOBS", "assemble_knobs", "knobs_summary"]

GROUP_KNOBS = ("batching", "cache")
TARGET = "image-classifier"


def _group(option: str, value: str) -> dict[str, Any]:
    """A group knob's option value: a mode word, or the group as a JSON object."""
    text = value.strip()
    if not text.startswith(("{", "[")):
        return {"mode": text}
    try:
        group = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"--{option}: {value!r} is not valid JSON ({exc.msg} at column {exc.colno})",
            hint=f"give a mode word or a JSON object, e.g. --{option} " + _example(option),
        ) from exc
    if not isinstance(group, dict):
        raise ConfigError(
            f"--{option}: {value!r} is not a JSON object",
            hint=f"give a mode word or a JSON object, e.g. --{option} " + _example(option),
        )
    return group


def _example(option: str) -> str:
    if option == "batching":
        return """'{"mode":"dynamic","max_batch_size":8,"max_wait_ms":2}'"""
    return """'{"mode":"lru","max_entries":1024}'"""


def _variants(option: str) -> dict[str, type[BaseModel]]:
    """A group knob's variants by mode word, read from `BuiltinKnobs` (one source of truth)."""
    annotation = BuiltinKnobs.model_fields[option].annotation
    found: dict[str, type[BaseModel]] = {}
    for variant in getattr(annotation, "__args__", ()):
        if isinstance(variant, type) and issubclass(variant, BaseModel):
            for mode in getattr(variant.model_fields["mode"].annotation, "__args__", ()):
                found[str(mode)] = variant
    return found


def assemble_knobs(options: dict[str, Any]) -> dict[str, Any]:
    """The knobs dict of the command line's options, validated against `BuiltinKnobs`.

    `options` maps knob names to option values (None: the model's default). A group knob's
    value is a mode word (`off`, `dynamic`, `lru`: that variant's defaults) or the group as a
    JSON object, exactly as an experiment's knob template renders it (compact JSON).
    Errors name the option and the field, and say what is allowed.
    """
    knobs: dict[str, Any] = {}
    for name, value in options.items():
        if name not in BuiltinKnobs.model_fields:
            raise ConfigError(
                f"unknown knob {name!r}",
                hint=f"the {TARGET} target's knobs are {', '.join(BuiltinKnobs.model_fields)}",
            )
        if value is None:
            continue
        knobs[name] = _group(name, value) if name in GROUP_KNOBS else value
    try:
        model = BuiltinKnobs.model_validate(knobs)
    except ValidationError as exc:
        raise _knob_error(exc, knobs) from exc
    return model.model_dump(mode="json")


def _knob_error(exc: ValidationError, knobs: dict[str, Any]) -> ConfigError:
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    option = loc[0] if loc else "knobs"
    message = f"--{option}: {first['msg']}"
    hint = f"the {TARGET} target's knobs are {', '.join(BuiltinKnobs.model_fields)}"
    if option in GROUP_KNOBS:
        # loc is (group, variant tag, field) for a field of a discriminated variant.
        field = ".".join(loc[2:]) if len(loc) > 2 else ".".join(loc[1:])
        if field:
            message = f"--{option}: field {field!r}: {first['msg']}"
        group = knobs.get(option)
        mode = group.get("mode") if isinstance(group, dict) else None
        variants = _variants(option)
        if isinstance(mode, str) and mode in variants:
            fields = ", ".join(variants[mode].model_fields)
            hint = f"{option} mode {mode!r} takes the fields {fields}"
        else:
            hint = f"{option} modes are {', '.join(variants)}"
    elif "input" in first:
        message += f" (got {first['input']!r})"
    return ConfigError(message, hint=hint)


def knobs_summary(knobs: dict[str, Any]) -> str:
    """One line: `engine=torch precision=fp32 batching=off ...`, groups as compact JSON."""
    parts = []
    for name, value in knobs.items():
        if isinstance(value, dict):
            shown = (
                str(value["mode"])
                if set(value) == {"mode"} or value.get("mode") == "off"
                else json.dumps(value, separators=(",", ":"))
            )
        else:
            shown = str(value)
        parts.append(f"{name}={shown}")
    return " ".join(parts)
