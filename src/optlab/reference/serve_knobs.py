"""The reference services' knob options: a target's knobs from the command line.

A group knob (`--batching`, `--cache`) is a mode word or the group as JSON, exactly as an
experiment's knob template renders it; any other value is read as JSON where it parses (`true`,
`8`) and as text otherwise (`fp32`). Everything is validated against the service's knobs model
(`BuiltinKnobs` for `optlab serve`, `LlmKnobs` for the reference LLM), so a service takes the
same knobs an experiment file does.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from optlab.config.knobs import BuiltinKnobs
from optlab.errors import ConfigError

__all__ = ["assemble_knobs", "group_knobs", "knobs_summary"]


def _group(model: type[BaseModel], option: str, value: str) -> dict[str, Any]:
    """A group knob's option value: a mode word, or the group as a JSON object."""
    text = value.strip()
    if not text.startswith(("{", "[")):
        return {"mode": text}
    try:
        group = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"--{option}: {value!r} is not valid JSON ({exc.msg} at column {exc.colno})",
            hint=f"give a mode word or a JSON object, e.g. --{option} " + _example(model, option),
        ) from exc
    if not isinstance(group, dict):
        raise ConfigError(
            f"--{option}: {value!r} is not a JSON object",
            hint=f"give a mode word or a JSON object, e.g. --{option} " + _example(model, option),
        )
    return group


def _example(model: type[BaseModel], option: str) -> str:
    """The group as JSON, for its first variant with fields beyond `mode` (their defaults)."""
    for mode, variant in _variants(model, option).items():
        fields = {name: f.default for name, f in variant.model_fields.items() if name != "mode"}
        if fields:
            return "'" + json.dumps({"mode": mode, **fields}, separators=(",", ":")) + "'"
    return '\'{"mode":"off"}\''


def _scalar(value: str) -> Any:
    """`true`, `8`, `0.5` as JSON; anything else (`fp32`) as the text it is."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def group_knobs(model: type[BaseModel]) -> tuple[str, ...]:
    """The model's group knobs: those whose variants are models told apart by `mode`."""
    return tuple(name for name in model.model_fields if _variants(model, name))


def _variants(model: type[BaseModel], option: str) -> dict[str, type[BaseModel]]:
    """A group knob's variants by mode word, read from the knobs model (one source of truth)."""
    annotation = model.model_fields[option].annotation
    found: dict[str, type[BaseModel]] = {}
    for variant in getattr(annotation, "__args__", ()):
        if isinstance(variant, type) and issubclass(variant, BaseModel):
            for mode in getattr(variant.model_fields["mode"].annotation, "__args__", ()):
                found[str(mode)] = variant
    return found


def assemble_knobs(
    options: dict[str, Any], model: type[BaseModel] = BuiltinKnobs, target: str = "image-classifier"
) -> dict[str, Any]:
    """The knobs dict of the command line's options, validated against `model`.

    `options` maps knob names to option values (None: the model's default). A group knob's
    value is a mode word (`off`, `dynamic`, `lru`: that variant's defaults) or the group as a
    JSON object, exactly as an experiment's knob template renders it (compact JSON).
    Errors name the option and the field, and say what is allowed.
    """
    knobs: dict[str, Any] = {}
    groups = group_knobs(model)
    for name, value in options.items():
        if name not in model.model_fields:
            raise ConfigError(
                f"unknown knob {name!r}",
                hint=f"the {target} target's knobs are {', '.join(model.model_fields)}",
            )
        if value is None:
            continue
        if name in groups:
            knobs[name] = _group(model, name, value)
        else:
            knobs[name] = _scalar(value) if isinstance(value, str) else value
    try:
        validated = model.model_validate(knobs)
    except ValidationError as exc:
        raise _knob_error(exc, knobs, model, target) from exc
    return validated.model_dump(mode="json")


def _knob_error(
    exc: ValidationError, knobs: dict[str, Any], model: type[BaseModel], target: str
) -> ConfigError:
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    option = loc[0] if loc else "knobs"
    message = f"--{option}: {first['msg']}"
    hint = f"the {target} target's knobs are {', '.join(model.model_fields)}"
    if option in group_knobs(model):
        # loc is (group, variant tag, field) for a field of a discriminated variant.
        field = ".".join(loc[2:]) if len(loc) > 2 else ".".join(loc[1:])
        if field:
            message = f"--{option}: field {field!r}: {first['msg']}"
        group = knobs.get(option)
        mode = group.get("mode") if isinstance(group, dict) else None
        variants = _variants(model, option)
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
