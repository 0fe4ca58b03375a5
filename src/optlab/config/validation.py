"""Turning pydantic validation errors into messages that name the file, line, field and fix."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from optlab.config.models import (
    ENV_NAME_PATTERN,
    HEADER_NAME_PATTERN,
    NAME_PATTERN,
    REFERENCE_PATTERN,
)
from optlab.config.source import KeyPath, SourceFile
from optlab.errors import ConfigError


@dataclass(frozen=True)
class _Located:
    path: KeyPath  # field path as the user wrote it (union tags removed)
    siblings: tuple[str, ...]  # valid keys beside the last part, when known


def _model_members(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _model_members(a)]
    if origin is typing.Annotated:
        return _model_members(typing.get_args(annotation)[0])
    return []


def _tag_values(model: type[BaseModel], discriminator: str) -> tuple[Any, ...]:
    field = model.model_fields.get(discriminator)
    return typing.get_args(field.annotation) if field is not None else ()


def _locate(root: type[BaseModel] | None, loc: Sequence[str | int]) -> _Located:
    """Walk `loc` through the model tree; drop the tag parts pydantic adds for tagged unions."""
    current: type[BaseModel] | None = root
    path: list[str | int] = []
    siblings: tuple[str, ...] = ()
    index = 0
    while index < len(loc):
        part = loc[index]
        index += 1
        path.append(part)
        if current is None or not isinstance(part, str):
            current, siblings = None, ()
            continue
        siblings = tuple(current.model_fields)
        field = current.model_fields.get(part)
        if field is None:
            current = None
            continue
        members = _model_members(field.annotation)
        discriminator = field.discriminator if isinstance(field.discriminator, str) else None
        if discriminator and index < len(loc):
            tag = loc[index]
            chosen = [m for m in members if tag in _tag_values(m, discriminator)]
            if chosen:
                index += 1  # the tag is pydantic's, not the user's
                current = chosen[0]
                continue
        current = members[0] if len(members) == 1 else None
    return _Located(tuple(path), siblings)


def _dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "(top level)"


def _suggest(word: str, options: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return close[0] if close else None


def _expected_literals(ctx: dict[str, Any]) -> list[str]:
    expected = str(ctx.get("expected") or ctx.get("expected_tags") or "")
    return [p.strip(" '\"") for p in expected.replace(" or ", ",").split(",") if p.strip(" '\"")]


def describe_error(
    error: Any, root: type[BaseModel] | None, source: SourceFile, file_prefix: KeyPath
) -> tuple[str, str | None]:
    """One line for one pydantic error, and a fix for it when one can be named."""
    located = _locate(root, error["loc"])
    file_path = (*file_prefix, *located.path)
    where = source.where(file_path)
    field = _dotted(file_path)
    error_type = error["type"]
    value = error.get("input")
    fix: str | None = None
    if error_type == "extra_forbidden":
        key = str(located.path[-1]) if located.path else "?"
        message = f"unknown key {key!r}"
        guess = _suggest(key, located.siblings)
        if guess:
            fix = f"did you mean {guess!r}? (in {_dotted((*file_path[:-1], guess))})"
        elif located.siblings:
            fix = "valid keys here: " + ", ".join(located.siblings)
    elif error_type == "missing":
        message = "required field is missing"
        fix = f"add {_dotted(file_path)!r} to the file"
    elif error_type in ("literal_error", "union_tag_invalid"):
        options = _expected_literals(error.get("ctx", {}))
        got = value.get(located_key(error)) if error_type == "union_tag_invalid" else value
        message = f"{got!r} is not allowed; expected one of: {', '.join(options)}"
        guess = _suggest(str(got), options)
        fix = f"did you mean {guess!r}?" if guess else f"use one of: {', '.join(options)}"
    elif error_type == "union_tag_not_found":
        tag = located_key(error)
        message = f"needs {tag!r} to say which variant it is"
        fix = f"add {tag}: ... under {field}"
    elif error_type == "string_pattern_mismatch" and (
        str(error.get("ctx", {}).get("pattern", "")) in PATTERN_HINTS
    ):
        what, rule = PATTERN_HINTS[str(error["ctx"]["pattern"])]
        message = f"{value!r} is not {what}"
        fix = rule
    elif error_type == "finite_number":
        message = f"{value!r} is not a finite number"
        fix = f"give {field} a finite number"
    else:
        message = f"{error['msg']} (got {value!r})" if "input" in error else error["msg"]
    return f"{where}: {field}: {message}", fix


# Patterns whose regex says little to a reader: what the value must be, the rule in words, and
# an example.
PATTERN_HINTS = {
    r"^(https?://|\$\{)": (
        "an http(s) URL",
        "write it whole, e.g. http://127.0.0.1:8000/predict (or start it with ${ENV_VAR})",
    ),
    NAME_PATTERN: (
        "a valid experiment name",
        "a name is letters, digits, '-', '_' and '.', starting with a letter or digit, at most "
        "100 characters, e.g. fp16-batch8",
    ),
    REFERENCE_PATTERN: (
        "a module:function reference",
        "a reference is an importable module path, a colon, then a function or class "
        "name, each part letters, digits and '_' (no '-'), e.g. my_model.serving:build",
    ),
    ENV_NAME_PATTERN: (
        "an environment variable name",
        "an environment variable name is letters, digits and '_', not starting with a "
        "digit, e.g. MODEL_PATH",
    ),
    HEADER_NAME_PATTERN: (
        "an HTTP header name",
        "a header name is letters, digits and !#$%&'*+.^_`|~- with no spaces or ':', "
        "e.g. X-Api-Key",
    ),
}


def located_key(error: Any) -> str:
    return str(error.get("ctx", {}).get("discriminator", "mode")).strip("'\"")


def config_error(
    exc: ValidationError,
    root: type[BaseModel] | None,
    source: SourceFile,
    file_prefix: KeyPath = (),
) -> ConfigError:
    """Collect every problem of a file in one error: fixing them one run at a time is tedious."""
    lines: list[str] = []
    fixes: list[str] = []
    for error in exc.errors():
        line, fix = describe_error(error, root, source, file_prefix)
        lines.append(line)
        if fix:
            fixes.append(fix)
    count = len(lines)
    head = f"{source.path}: {count} problem{'s' if count != 1 else ''} in the experiment file"
    return ConfigError(
        "\n".join([head, *("  " + line for line in lines)]),
        hint="; ".join(fixes) if fixes else "see experiments/baseline.yaml for a valid layout",
    )


ModelT = typing.TypeVar("ModelT", bound=BaseModel)


def target_knobs(model: type[ModelT], knobs: dict[str, Any], target: str) -> ModelT:
    """A built-in target's knobs, validated again where the target is built: a stored config
    may have come from another version of optlab, or a caller may build the target directly."""
    try:
        return model.model_validate(knobs)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "knobs"
        raise ConfigError(
            f"{target}: knobs.{where}: {first['msg']}",
            hint=f"the {target} target's knobs are {', '.join(model.model_fields)}",
        ) from exc
