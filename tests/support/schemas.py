"""A document against its JSON Schema in docs/schemas/ (2020-12): every way it breaks it."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from tests.support.paths import REPO

SCHEMAS = REPO / "docs" / "schemas"


@cache
def validator(name: str) -> Draft202012Validator:
    """The validator of docs/schemas/NAME.schema.json, the schema itself checked first."""
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text("utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def problems(name: str, value: Any) -> list[str]:
    """Every way `value` breaks the schema NAME, each with where."""
    found = []
    for error in validator(name).iter_errors(value):
        # Under anyOf/oneOf (baseline or step, each target kind), the deepest error says more.
        deepest = best_match([error]) or error
        found.append(f"{'/'.join(map(str, deepest.absolute_path)) or '(top)'}: {deepest.message}")
    return found
