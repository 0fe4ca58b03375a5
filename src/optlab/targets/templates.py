"""Templates in a service's command, environment, URL and headers, and the secrets they name.

`{knobs.batching.max_batch_size}` is replaced by the knob's value (a group or list by its
compact JSON, so one argument carries a whole group knob), `{python}` by the interpreter
running optlab. `${ENV_VAR}` is read from the environment when the run starts: every such
value is treated as a secret. The stored config keeps the reference, and every text optlab
writes about the run (errors, log tails, notes) passes through `Secrets.redact` first.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from optlab.config.models import CommandTarget, HttpTarget, OpenAITarget
from optlab.errors import ConfigError

# The targets measured over the network, whose fields may hold templates.
NetworkTarget = CommandTarget | HttpTarget | OpenAITarget

__all__ = [
    "ENV_REFERENCE",
    "KNOB_REFERENCE",
    "Secrets",
    "check_environment",
    "check_knob_references",
    "render",
    "target_templates",
]

ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
KNOB_REFERENCE = re.compile(r"\{(knobs(?:\.[A-Za-z0-9_-]+)+|python)\}")
REDACTED = "${%s}"


def _knob(knobs: Mapping[str, Any], dotted: str, field: str) -> Any:
    value: Any = knobs
    walked = "knobs"
    for part in dotted.split(".")[1:]:
        if not isinstance(value, Mapping) or part not in value:
            known = sorted(value) if isinstance(value, Mapping) else []
            raise ConfigError(
                f"{field}: {{{dotted}}} names no knob: {walked} has no {part!r}"
                + (f" (it has {', '.join(map(str, known))})" if known else ""),
                hint="reference a knob the resolved config holds; a knob that only some steps "
                "set can be passed whole: {knobs.<group>} renders the group as JSON",
            )
        value = value[part]
        walked += f".{part}"
    return value


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def render(template: str, knobs: Mapping[str, Any], field: str) -> str:
    """The template with its knob and `{python}` references replaced (secrets left as is)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "python":
            return sys.executable
        return _text(_knob(knobs, name, field))

    return KNOB_REFERENCE.sub(replace, template)


def check_knob_references(templates: Iterable[tuple[str, str]], knobs: Mapping[str, Any]) -> None:
    """Refuse at load time a template that names a knob the config does not hold."""
    for field, template in templates:
        render(template, knobs, field)


def target_templates(target: NetworkTarget) -> list[tuple[str, str]]:
    """(field, text) of every templated field of a network target."""
    found = [("target.url", target.url)]
    found += [(f"target.headers.{k}", v) for k, v in target.headers.items()]
    if isinstance(target, CommandTarget | OpenAITarget) and target.command:
        found += [(f"target.command[{i}]", arg) for i, arg in enumerate(target.command)]
        found += [(f"target.env.{k}", v) for k, v in target.env.items()]
        if target.health_url:
            found.append(("target.health_url", target.health_url))
    for field in ("metrics_url", "metrics_reset_url", "accuracy_url", "prometheus_url"):
        value = getattr(target, field, None)
        if value:
            found.append((f"target.{field}", value))
    return found


def check_environment(target: Any, where: str, environ: Mapping[str, str] | None = None) -> None:
    """Before a run is created: every `${ENV_VAR}` the target names is set."""
    if not isinstance(target, NetworkTarget):
        return
    environ = os.environ if environ is None else environ
    for field, text in target_templates(target):
        for name in ENV_REFERENCE.findall(text):
            if name not in environ:
                raise ConfigError(
                    f"{where}: {field} needs the environment variable {name}, which is not set",
                    hint=f"export {name}=... before `optlab run`; it is read when the run "
                    "starts and never stored",
                )


class Secrets:
    """The `${ENV_VAR}` values resolved for one run, and the redaction of every one of them."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        self._values: dict[str, str] = {}

    def resolve(self, text: str, field: str) -> str:
        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            value = self._environ.get(name)
            if value is None:
                raise ConfigError(
                    f"{field}: the environment variable {name} is not set",
                    hint=f"export {name}=... before `optlab run`; it is read when the run "
                    "starts and never stored",
                )
            if value:
                self._values[value] = name
            return value

        return ENV_REFERENCE.sub(replace, text)

    def fill(self, template: str, knobs: Mapping[str, Any], field: str) -> str:
        """A field as the service gets it: knob references rendered, secrets resolved."""
        return self.resolve(render(template, knobs, field), field)

    def redact(self, text: str) -> str:
        """`text` with every resolved value replaced by its `${NAME}` reference."""
        if not self._values or not text:
            return text
        # Longest first: a value that contains another must be replaced whole.
        for value in sorted(self._values, key=len, reverse=True):
            if value in text:
                text = text.replace(value, REDACTED % self._values[value])
        return text

    def redact_any(self, value: Any) -> Any:
        """Redacted copy of a JSON-like value (dict, list, str)."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self.redact(str(k)): self.redact_any(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_any(v) for v in value]
        return value

    def __bool__(self) -> bool:
        return bool(self._values)
