"""Reading YAML experiment files while remembering where every key was written.

Errors must name the file and the line, so the loader keeps a map from each
key path to its line. The resolver follows YAML 1.2 for booleans: only
true/false are booleans, so `mode: off` stays the string "off" (YAML 1.1 would
silently turn it into False and the user would get a baffling type error).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from optlab.errors import ConfigError

KeyPath = tuple[str | int, ...]


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans."""


# Drop YAML 1.1's yes/no/on/off booleans, keep true/false.
_Loader.yaml_implicit_resolvers = {
    key: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.copy().items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


@dataclass(frozen=True)
class SourceFile:
    """One parsed YAML file: its data, where each key sits, and a hash of its bytes."""

    path: Path
    data: dict[str, Any]
    sha256: str
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, loc: KeyPath) -> int | None:
        """The line of the deepest written key on `loc` (a typo'd child reports its parent)."""
        for end in range(len(loc), -1, -1):
            line = self.lines.get(tuple(loc[:end]))
            if line is not None:
                return line
        return None

    def where(self, loc: KeyPath = ()) -> str:
        line = self.line_of(loc)
        return f"{self.path}:{line}" if line is not None else str(self.path)


def _construct(node: yaml.Node, loader: _Loader, path: KeyPath, lines: dict[KeyPath, int]) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise ConfigError(
                    f"line {key_node.start_mark.line + 1}: key {key!r} is not a string",
                    hint="quote the key, e.g. '\"8\": ...'",
                )
            if key in out:
                raise ConfigError(
                    f"line {key_node.start_mark.line + 1}: key {key!r} appears twice",
                    hint="remove one of the two entries; YAML would silently keep the last",
                )
            child = (*path, key)
            lines[child] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, loader, child, lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            child = (*path, index)
            lines[child] = item.start_mark.line + 1
            items.append(_construct(item, loader, child, lines))
        return items
    return loader.construct_object(node, deep=True)


def parse_yaml(text: str, path: Path) -> SourceFile:
    """Parse `text` (the contents of `path`) into a SourceFile; errors name the file."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        lines: dict[KeyPath, int] = {}
        data = _construct(node, loader, (), lines) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(
            f"{at}: not valid YAML: {exc.problem}",
            hint="check the indentation and quoting around that line",
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}", hint="fix the YAML syntax") from exc
    except ConfigError as exc:
        raise ConfigError(f"{path}:{exc.message.removeprefix('line ')}", exc.hint) from exc
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of keys (name, target, knobs, ...), "
            f"found {type(data).__name__ if data is not None else 'an empty file'}",
            hint="see experiments/baseline.yaml for the layout of an experiment file",
        )
    digest = hashlib.sha256(text.encode()).hexdigest()
    return SourceFile(path=path, data=data, sha256=digest, lines=lines)


def read_yaml(path: Path) -> SourceFile:
    """Read and parse an experiment file, with errors that say what to do."""
    if not path.exists():
        raise ConfigError(
            f"{path}: no such file",
            hint="pass the path of an experiment YAML file, e.g. experiments/baseline.yaml",
        )
    if path.is_dir():
        raise ConfigError(
            f"{path}: is a folder, not an experiment file",
            hint=f"name one file inside it, e.g. {path / 'baseline.yaml'}",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file", hint="save it as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot be read: {exc.strerror}", hint="check permissions"
        ) from exc
    return parse_yaml(text, path)
