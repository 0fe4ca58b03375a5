"""Reading YAML experiment files while remembering where every key was written.

Errors must name the file and the line, so the loader keeps a map from each
key path to its line. The resolver follows YAML 1.2 for booleans: only
true/false are booleans, so `mode: off` stays the string "off" (YAML 1.1 would
silently turn it into False and the user would get a baffling type error).

An experiment file is small, hand-written configuration, so anything else is refused before it
can cost time or memory: files that are not regular files (a FIFO blocks forever, /dev/zero never
ends) or over MAX_FILE_BYTES; YAML anchors and aliases (nested aliases expand exponentially: a
few hundred bytes of "billion laughs" took gigabytes); nesting deeper than MAX_DEPTH (the
composer recurses); numbers that are not finite.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from optlab.config.regular import file_kind, open_regular
from optlab.errors import ConfigError

KeyPath = tuple[str | int, ...]

MAX_FILE_BYTES = 1 << 20  # 1 MiB: hundreds of times the largest real experiment file
MAX_DEPTH = 64  # mappings and lists inside each other; real files nest 4 or 5 deep
# A neighbour's `name` is looked for among its first events only (a real file has it within
# a few dozen), so an odd file in the folder costs milliseconds, never a full parse.
NAME_SCAN_EVENTS = 5_000
_LAYOUT_HINT = "see experiments/baseline.yaml for the layout of an experiment file"


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans, no anchors or aliases, and a nesting limit."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # Checked on the event, before PyYAML's composer links the alias: nothing is expanded.
        event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise ConfigError(
                f"line {line}: YAML alias *{event.anchor} is not allowed in experiment files",
                hint="write the value out in full instead of `*name` (aliases can expand a "
                "small file into gigabytes, so optlab refuses them)",
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise ConfigError(
                f"line {line}: YAML anchor &{anchor} is not allowed in experiment files",
                hint="remove `&" + anchor + "` and write out each value in full where it is "
                "used (optlab refuses anchors and aliases)",
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ConfigError(
                    f"line {line}: nested more than {MAX_DEPTH} levels deep",
                    hint="an experiment file nests a few levels (knobs: batching: mode); "
                    "flatten the structure",
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


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


def _dotted(path: KeyPath) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _scalar(node: yaml.Node, loader: _Loader, path: KeyPath) -> Any:
    line = node.start_mark.line + 1
    try:
        value = loader.construct_object(node, deep=True)
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ConfigError(
            f"line {line}: {_dotted(path)}: {node.value[:40]!r} is not a usable value ({exc})",
            hint="write a number of ordinary size, or quote it to make it a string",
        ) from exc
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(
            f"line {line}: {_dotted(path)}: {node.value!r} is not a finite number",
            hint="give a finite number (NaN and infinity are never valid settings), "
            "or quote it to make it a string",
        )
    return value


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
    return _scalar(node, loader, path)


def _reader_error(exc: yaml.reader.ReaderError, text: str, path: Path) -> ConfigError:
    line = text.count("\n", 0, exc.position) + 1
    code = exc.character if isinstance(exc.character, int) else ord(exc.character)
    return ConfigError(
        f"{path}:{line}: character U+{code:04X} is not allowed in a YAML file (a control "
        "character or NUL byte)",
        hint="remove it; an experiment file is plain UTF-8 text",
    )


def parse_yaml(text: str, path: Path) -> SourceFile:
    """Parse `text` (the contents of `path`) into a SourceFile; errors name the file."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # the reader checks for control characters here
        node = loader.get_single_node()
        lines: dict[KeyPath, int] = {}
        data = _construct(node, loader, (), lines) if node is not None else None
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text, path) from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(
            f"{at}: not valid YAML: {exc.problem}",
            hint="check the indentation and quoting around that line",
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}", hint="fix the YAML syntax") from exc
    except RecursionError as exc:  # MAX_DEPTH should stop it first; never a bare traceback
        raise ConfigError(
            f"{path}: nested too deeply to read", hint="flatten the structure"
        ) from exc
    except ConfigError as exc:
        raise ConfigError(f"{path}:{exc.message.removeprefix('line ')}", exc.hint) from exc
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of keys (name, target, knobs, ...), "
            f"found {type(data).__name__ if data is not None else 'an empty file'}",
            hint=_LAYOUT_HINT,
        )
    digest = hashlib.sha256(text.encode()).hexdigest()
    return SourceFile(path=path, data=data, sha256=digest, lines=lines)


_PATH_HINT = "pass the path of an experiment YAML file, e.g. experiments/baseline.yaml"


def _stat_error(path: Path, exc: OSError) -> ConfigError:
    if exc.errno == errno.ELOOP:
        return ConfigError(
            f"{path}: symlink loop (the link points, through other links, back to itself)",
            hint="point the link at the experiment file: `ln -sf REAL.yaml " + f"{path}`",
        )
    if exc.errno == errno.ENOENT and path.is_symlink():
        return ConfigError(
            f"{path}: a symlink to {os.readlink(path)}, which does not exist",
            hint="point the link at an existing experiment file, or pass that file's path",
        )
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return ConfigError(f"{path}: no such file", hint=_PATH_HINT)
    if exc.errno == errno.EACCES:
        return ConfigError(
            f"{path}: permission denied", hint="check the permissions of the file and its folder"
        )
    return ConfigError(f"{path}: cannot be read: {exc.strerror}", hint=_PATH_HINT)


def read_bytes(path: Path) -> bytes:
    """The bytes of an experiment file, after checking (with stat, before opening: opening a
    FIFO blocks) that it is a regular file of at most MAX_FILE_BYTES."""
    try:
        with open_regular(path, _check_regular, _stat_error) as handle:
            try:
                data = handle.read(MAX_FILE_BYTES + 1)  # never more, whatever stat said
            except OSError as exc:
                raise ConfigError(
                    f"{path}: cannot be read: {exc.strerror}", hint="check the file and its disk"
                ) from exc
    except ValueError as exc:  # a NUL byte in the path
        raise ConfigError(f"{path!s}: not a valid path ({exc})", hint=_PATH_HINT) from exc
    if len(data) > MAX_FILE_BYTES:
        _too_large(path, len(data), exact=False)
    return data


def _check_regular(path: Path, info: os.stat_result) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(
            f"{path}: is a folder, not an experiment file",
            hint=f"name one file inside it, e.g. {path / 'baseline.yaml'}",
        )
    if not stat.S_ISREG(info.st_mode):
        kind = file_kind(info)
        raise ConfigError(
            f"{path}: is {kind}, not an experiment file",
            hint="pass a regular YAML file (a link to one is fine), e.g. experiments/baseline.yaml",
        )
    if info.st_size > MAX_FILE_BYTES:
        _too_large(path, info.st_size, exact=True)


def _too_large(path: Path, size: int, *, exact: bool) -> NoReturn:
    raise ConfigError(
        f"{path}: {size:,} bytes{'' if exact else ' or more'}, over the {MAX_FILE_BYTES:,}-byte "
        "limit of an experiment file",
        hint="an experiment file holds settings only; put request bodies in files named by "
        "workload.inputs (files, jsonl)",
    )


def decode(data: bytes, path: Path) -> str:
    """UTF-8 text with universal newlines, as Path.read_text gave (stored hashes depend on it)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x})",
            hint="save the file as UTF-8",
        ) from exc
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_yaml(path: Path) -> SourceFile:
    """Read and parse an experiment file, with errors that say what to do."""
    return parse_yaml(decode(read_bytes(path), path), path)


def read_name(path: Path) -> str | None:
    """The top-level `name` of a file, from its first YAML events only: nothing is built, no
    alias expanded, and a file without a readable name costs at most NAME_SCAN_EVENTS events.
    None when the file has no string `name`; ConfigError when it cannot be read that far."""
    text = decode(read_bytes(path), path)
    loader: _Loader | None = None
    try:
        loader = _Loader(text)
        events = 0
        depth = 0
        expect_key = False  # only at depth 1 (the top mapping) do keys and values alternate
        pending_name = False
        while loader.check_event():
            if events == NAME_SCAN_EVENTS:
                raise ConfigError(
                    f"{path}: no top-level `name` among its first {NAME_SCAN_EVENTS} YAML "
                    "events; not read further",
                    hint="put `name:` at the top of the file",
                )
            event = loader.get_event()  # type: ignore[no-untyped-call]
            events += 1
            if isinstance(event, yaml.CollectionStartEvent):
                if depth == 0:
                    if not isinstance(event, yaml.MappingStartEvent):
                        return None
                    expect_key = True
                elif depth == 1:
                    if pending_name:  # `name:` holds a mapping or list, not a name
                        return None
                    expect_key = not expect_key
                depth += 1
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
                if depth == 0:
                    return None
            elif depth == 1 and isinstance(event, yaml.ScalarEvent | yaml.AliasEvent):
                if pending_name:
                    if isinstance(event, yaml.AliasEvent):
                        return None
                    tag = loader.resolve(  # type: ignore[no-untyped-call]
                        yaml.ScalarNode, event.value, event.implicit
                    )
                    return event.value if tag == "tag:yaml.org,2002:str" else None
                if expect_key and isinstance(event, yaml.ScalarEvent) and event.value == "name":
                    pending_name = True
                expect_key = not expect_key
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text, path) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML", hint="fix the YAML syntax") from exc
    finally:
        if loader is not None:
            loader.dispose()
    return None
