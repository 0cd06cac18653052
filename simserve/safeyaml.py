"""Reading YAML (and any text file) a user gives us: one clear error, never a hang.

PyYAML's ``safe_load`` is safe against code execution, not against everything else a file can
hold. This loader adds what a scenario file needs:

* the bytes must be UTF-8 text: UTF-16/32 (a BOM, or NUL bytes between ASCII letters), stray
  NUL bytes and undecodable bytes are refused with ``file:line``;
* nesting deeper than ``MAX_DEPTH`` is refused (PyYAML's composer recurses per level, so a file
  of ``[[[[...`` would end in a RecursionError);
* aliases may not add more than ``MAX_NODES`` nodes to those written out (an "alias bomb" — a
  few lines whose aliases nest to billions of nodes — is refused while parsing, before anything
  walks it), and an alias may not contain itself; a file without aliases is bounded by its size;
* a key given twice in one mapping is an error: silently keeping the last one changes the
  experiment without a word (explicit keys may still override ``<<:`` merged ones);
* numbers follow YAML 1.2: ``1e1`` and ``2E-3`` are numbers (YAML 1.1 wants a dot: ``1.0e1``);
  a number too large for a float (``1e400``) is refused, in files and ``--set`` alike (``.inf``
  is infinity, where a field allows it).
"""

from __future__ import annotations

import codecs
import math
import re
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from simserve.errors import ConfigError, DataError

MAX_DEPTH = 64                  # nesting levels (a scenario needs about 6)
MAX_NODES = 100_000             # nodes aliases may add (a scenario has a few hundred in all)
MAX_BYTES = 16 * 2**20          # a scenario or sweep file

_FLOAT_12 = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Limit(Exception):
    """A limit of this loader was passed; ``line`` is 1-based where known."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.message, self.line = message, line


class SafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with depth, alias-expansion and duplicate-key checks, YAML 1.2
    exponents. One instance per document (it counts)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Limit(f"nested more than {MAX_DEPTH} levels deep", mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        if node is not None:
            _expanded_size(node)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                    continue            # merged keys may be overridden; other keys are refused
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:       # unhashable: the constructor reports it
                    continue
                if first is not None:
                    raise _Limit(f"duplicate key {key!r} (first given on line {first}); each "
                                 "key may appear once in a mapping", line)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


    def construct_yaml_float(self, node: ScalarNode) -> float:
        """A float; a literal that overflows to infinity (``1e400``) is refused: read silently,
        ``rate: 1e400`` would be ``rate: inf`` (every request at t = 0). ``.inf`` stays
        infinity, written as such (each field says whether it takes it; NaN is refused there)."""
        value: float = super().construct_yaml_float(node)
        if math.isinf(value) and ".inf" not in node.value.lower():
            raise _Limit(f"{node.value} is too large for a number (it overflows to infinity);"
                         f" write .inf where infinity is meant", node.start_mark.line + 1)
        return value


SafeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789"))
SafeLoader.add_constructor("tag:yaml.org,2002:float", SafeLoader.construct_yaml_float)


def _expanded_size(root: Node) -> int:
    """Nodes in the document once every alias is expanded; _Limit when the aliases add more
    than MAX_NODES to the nodes written out, or on an alias that contains itself. Shared nodes
    are counted once per use, in linear time.

    Only what aliases add is limited: nodes written out are bounded by the file's size
    (MAX_BYTES), so a long list in a file without aliases (a sweep's 100,001 values) is not a
    bomb; what it means is for the reader to bound (a sweep's MAX_SWEEP_POINTS)."""
    written = _written_nodes(root)
    limit = written + MAX_NODES
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _Limit("an alias refers to the node that contains it",
                         node.start_mark.line + 1)
        active.add(key)
        total = 1
        for child in _children(node):
            total += size(child)
            if total > limit:
                raise _Limit(f"the aliases expand to more than {MAX_NODES:,} values beyond "
                             f"the {written:,} written out (an alias bomb?)",
                             node.start_mark.line + 1)
        active.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _written_nodes(root: Node) -> int:
    """Distinct nodes in the document (each alias's target counted once)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(_children(node))
    return len(seen)


def read_text(path: str | Path, max_bytes: int | None = None) -> str:
    """The file as text; DataError (with the line where known) unless it is UTF-8 text."""
    path = Path(path)
    try:
        data = path.read_bytes() if max_bytes is None else _read_at_most(path, max_bytes)
    except FileNotFoundError:
        raise DataError(path, "file not found") from None
    except IsADirectoryError:
        raise DataError(path, "is a directory, not a file") from None
    except OSError as e:
        raise DataError(path, f"cannot read file ({e.strerror})") from None
    return decode_text(data, path)


def _read_at_most(path: Path, max_bytes: int) -> bytes:
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise DataError(path, f"larger than {max_bytes // 2**20} MiB; not a scenario file?")
    return data


def decode_text(data: bytes, path: str | Path) -> str:
    """Decode UTF-8 bytes (a UTF-8 BOM is allowed); DataError naming the line otherwise."""
    for bom, name in ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                      (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16")):
        if data.startswith(bom):
            raise DataError(path, f"is {name} text; save it as UTF-8")
    nul = data.find(b"\x00")
    if nul >= 0:
        # UTF-16 without a BOM: every other byte of ASCII text is NUL
        sample = data[:200]
        if len(sample) >= 4 and sample[1::2].count(0) + sample[0::2].count(0) >= len(sample) // 3:
            raise DataError(path, "looks like UTF-16 text; save it as UTF-8")
        raise DataError(path, "contains a NUL byte; not a text file?",
                        data.count(b"\n", 0, nul) + 1)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(path, f"is not UTF-8 text (byte 0x{data[e.start]:02x}); save it as "
                              "UTF-8", data.count(b"\n", 0, e.start) + 1) from None


def parse(text: str, path: str | Path, line_offset: int = 0) -> Any:
    """Parse one YAML document with :class:`SafeLoader`; DataError naming ``path:line``."""
    loader = None
    try:
        loader = SafeLoader(text)      # the reader checks every character here
        return loader.get_single_data()
    except _Limit as e:
        raise DataError(path, e.message, _line(e.line, line_offset)) from None
    except (ComposerError, ConstructorError, yaml.MarkedYAMLError) as e:
        mark = e.problem_mark or e.context_mark
        what = " ".join(str(e.problem or e.context or "syntax error").split())
        raise DataError(path, f"invalid YAML: {what}",
                        _line(mark.line + 1 if mark is not None else None, line_offset)) from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise DataError(path, f"invalid YAML: character #x{e.character:04x} is not allowed",
                        _line(line, line_offset)) from None
    except yaml.YAMLError as e:
        raise DataError(path, f"invalid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:          # a limit above should have caught it first
        raise DataError(path, "invalid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def _line(line: int | None, offset: int) -> int | None:
    return None if line is None else line + offset


def load(path: str | Path) -> Any:
    """Read and parse a YAML file (see the module docstring for what is refused)."""
    return parse(read_text(path, MAX_BYTES), path)


def parse_value(text: str, where: str) -> Any:
    """A ``--set FIELD=VALUE`` value parsed as YAML; ConfigError naming ``where``. A value that
    is not valid YAML is kept as the string it is (``--set name=a: b: c``, ``name=[x] y``),
    unless it opens a flow mapping or list (``{``, ``[``) left open at its end: that was meant
    as YAML, and kept as text it would be refused as the wrong type, hiding the syntax error."""
    if not text.strip():
        raise ConfigError(where, "no value given (FIELD=VALUE); write null to unset a field")
    if "\x00" in text:
        raise ConfigError(where, "the value contains a NUL character")
    try:
        return parse(text, where)
    except DataError as e:
        if e.message.startswith("invalid YAML") and not (
                text.lstrip()[0] in "{[" and ("<stream end>" in e.message
                                              or "end of stream" in e.message)):
            return text
        raise ConfigError(where, e.message) from None
