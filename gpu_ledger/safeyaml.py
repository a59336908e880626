"""One YAML loader for every configuration file (web config, scenarios, cost model).

PyYAML's SafeLoader is safe against code execution but not against size: a few kilobytes of
nested aliases ("billion laughs") stand for gigabytes once anything walks or prints the value,
and deep nesting overflows the composer's recursion. This loader refuses both while composing,
before any value is built, with a one-line error naming the file and the key:

- nesting deeper than MAX_DEPTH collections;
- aliases that expand the document by more than ALIAS_BUDGET nodes beyond what is written.

`describe()` shows a found value for an error message without serialising it, so a message
never expands a value either. Only PyYAML is imported: exporter and metering both use this.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml

MAX_DEPTH = 64  # our files nest under 10 levels; CPython's recursion limit allows ~300
ALIAS_BUDGET = 10_000  # nodes that aliases may add to a document beyond the written ones


class YamlError(ValueError):
    """A file that is not YAML, or YAML this loader refuses. str() is one line:
    `web.yml: basic_auth_users.bob: aliases expand beyond 10000 nodes (refused, not expanded)`
    or `web.yml: line 3, column 5: invalid YAML: found unexpected end of stream`.
    `key` is the key path where known, `where` the line and column where known."""

    def __init__(self, file: str, key: str, problem: str, where: str = "") -> None:
        self.file, self.key, self.problem, self.where = file, key, problem, where
        if not key:  # the parser's complaint, at a place in the text
            problem = f"invalid YAML: {problem}"
        at = key or where
        super().__init__(f"{file}: {at}: {problem}" if at else f"{file}: {problem}")


def describe(value: object, limit: int = 60, text: Callable[[str], str] = repr) -> str:
    """A found value for an error message, cut at `limit` characters: strings as `text` writes
    them (repr, or json.dumps for YAML-minded messages), collections bracketed. It stops
    writing at the limit, so a value that aliases expand to gigabytes costs `limit` steps."""
    out: list[str] = []
    size = 0

    def emit(text: str) -> bool:
        nonlocal size
        out.append(text)
        size += len(text)
        return size <= limit

    def walk(v: object) -> bool:
        if isinstance(v, dict):
            if not emit("{"):
                return False
            for i, (k, item) in enumerate(v.items()):
                if (i and not emit(", ")) or not walk(k) or not emit(": ") or not walk(item):
                    return False
            return emit("}")
        if isinstance(v, list | tuple):
            if not emit("["):
                return False
            for i, item in enumerate(v):
                if (i and not emit(", ")) or not walk(item):
                    return False
            return emit("]")
        if isinstance(v, str):
            return emit(text(v[: limit + 1]))
        if v is None or isinstance(v, bool):
            return emit(repr(v) if text is repr else {None: "null", True: "true",
                                                      False: "false"}[v])
        if isinstance(v, int | float):
            return emit(str(v))
        return emit(f"<{type(v).__name__}>")

    if walk(value):
        return "".join(out)
    return "".join(out)[: limit - 3] + "..."


def join_path(parts: list[str]) -> str:
    """`a.b[2].c`; a deep path keeps its ends: `a.b.c.d ... [0][0]`."""
    if len(parts) > 8:
        return join_path(parts[:4]) + " ... " + join_path(parts[-2:])
    out = ""
    for part in parts:
        out += part if part.startswith("[") or not out else "." + part
    return out or "(top level)"


def _key_text(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return str(node.value)[:60]
    return "<complex key>"


class _Loader(yaml.SafeLoader):
    """SafeLoader with a nesting limit while composing, and a key path for error messages."""

    file = ""
    unique_keys = False

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.path: list[str] = []
        self.anchored: set[int] = set()  # ids of nodes carrying an anchor
        self._anchor_count = 0

    def key_path(self) -> str:
        return join_path(self.path)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:  # type: ignore[override]
        if index is None and isinstance(parent, yaml.MappingNode):
            part = "<key>"  # composing a mapping key
        elif isinstance(index, int):
            part = f"[{index}]"
        elif isinstance(index, yaml.Node):
            part = _key_text(index)
        else:
            part = ""
        if part:
            self.path.append(part)
        if len(self.path) > MAX_DEPTH:
            raise YamlError(self.file, self.key_path(),
                            f"nesting deeper than {MAX_DEPTH} levels")
        try:
            node: yaml.Node = super().compose_node(parent, index)  # type: ignore[no-untyped-call,assignment]
        finally:
            if part:
                self.path.pop()
        if len(self.anchors) != self._anchor_count:  # PyYAML forgets anchors per document
            self._anchor_count = len(self.anchors)
            self.anchored.update(id(n) for n in self.anchors.values())
        return node


def _check_expansion(root: yaml.Node, file: str, anchored: set[int]) -> None:
    """Refuse a document whose alias-expanded size exceeds its written size by ALIAS_BUDGET.

    Sizes are memoised per node, so a bomb costs one visit per written node to measure."""
    sizes: dict[int, int] = {}
    distinct: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # iterative post-order: depth is bounded, but keep it off the C stack
        node, done = stack.pop()
        nid = id(node)
        if nid in sizes:
            continue
        children = _children(node)
        if not done:
            distinct.add(nid)
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        sizes[nid] = 1 + sum(sizes.get(id(c), 1) for c in children)
    if sizes[id(root)] - len(distinct) <= ALIAS_BUDGET:
        return
    # Name the key: follow the heaviest child down until an anchored node is reached.
    path: list[str] = []
    node = root
    while True:
        labelled = _labelled_children(node)
        if not labelled:
            break
        # Among equals the last: an alias comes after its anchor, and the use is the news.
        label, child = max(reversed(labelled), key=lambda lc: sizes.get(id(lc[1]), 1))
        path.append(label)
        if id(child) in anchored or sizes.get(id(child), 1) <= ALIAS_BUDGET:
            break
        node = child
    raise YamlError(file, join_path(path),
                    f"aliases expand beyond {ALIAS_BUDGET} nodes (refused, not expanded)")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _labelled_children(node: yaml.Node) -> list[tuple[str, yaml.Node]]:
    if isinstance(node, yaml.SequenceNode):
        return [(f"[{i}]", c) for i, c in enumerate(node.value)]
    if isinstance(node, yaml.MappingNode):
        return [(_key_text(k), v) for k, v in node.value]
    return []


def _construct_mapping_unique(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)  # type: ignore[no-untyped-call]
        try:
            fresh = key not in seen
        except TypeError:  # an unhashable key: the constructor below reports it
            continue
        if not fresh:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {repr(key)[:60]}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


class _UniqueLoader(_Loader):
    pass


_UniqueLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _construct_mapping_unique)

# YAML 1.2 floats that YAML 1.1 (PyYAML) reads as strings: `1e12`, `1.0e12`, `2E-3` (1.1 wants
# a dot and a signed exponent). Plain scalars only: a quoted "1e12" stays a string.
_FLOAT_12 = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


class _Loader12(_Loader):
    pass


class _UniqueLoader12(_UniqueLoader):
    pass


for _cls in (_Loader12, _UniqueLoader12):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))


def load(text: str, file: str, *, unique_keys: bool = False, exponent_floats: bool = False
         ) -> Any:
    """Parse one YAML document with SafeLoader semantics; YamlError on anything wrong.
    `unique_keys` refuses a key given twice in one mapping (PyYAML keeps the last);
    `exponent_floats` reads plain `1e12` / `1.0e12` as numbers, as YAML 1.2 does."""
    classes = {(False, False): _Loader, (True, False): _UniqueLoader,
               (False, True): _Loader12, (True, True): _UniqueLoader12}
    loader = classes[unique_keys, exponent_floats](text)
    loader.file = file
    try:
        try:
            root = loader.get_single_node()  # type: ignore[no-untyped-call]
        except RecursionError:  # a nesting the depth check did not see (flow keys)
            raise YamlError(file, loader.key_path(),
                            f"nesting deeper than {MAX_DEPTH} levels") from None
        if root is None:
            return None
        _check_expansion(root, file, loader.anchored)
        return loader.construct_document(root)  # type: ignore[no-untyped-call]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "unreadable"
        raise YamlError(file, "", problem, where) from None
    except yaml.YAMLError as exc:
        raise YamlError(file, "", str(exc).splitlines()[0]) from None
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]
