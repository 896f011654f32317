"""A safe YAML loader whose mappings and lists remember the line of each key/item, for error messages.

It is also strict where a YAML slip would otherwise pass silently: a key given twice in one mapping (the later
value would win unseen), a non-finite number (`.nan`, `.inf`, `1e999`) and an integer too long to be a setting are
errors at their line.
"""

from __future__ import annotations

import math
from typing import Any

import yaml


class MarkedDict(dict[str, Any]):
    """A dict that knows its own line and the line of each key (1-based; 0 if unknown)."""

    line: int = 0
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        return getattr(self, "key_lines", {}).get(key, self.line)


class MarkedList(list[Any]):
    line: int = 0
    item_lines: list[int]

    def line_of(self, index: int) -> int:
        lines = getattr(self, "item_lines", [])
        return lines[index] if 0 <= index < len(lines) else self.line


MAX_INT_DIGITS = 40  # far past any setting (2**64 has 20 digits), far below Python's 4,300-digit parse limit


class _Loader(yaml.SafeLoader):
    pass


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    digits = sum(c.isdigit() for c in str(node.value))
    if digits > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"integer of {digits} digits is out of range", node.start_mark
        )
    return int(loader.construct_yaml_int(node))


def _construct_float(loader: _Loader, node: yaml.ScalarNode) -> float:
    value = float(loader.construct_yaml_float(node))
    if not math.isfinite(value):
        raise yaml.constructor.ConstructorError(None, None, f"{node.value!r} is not a finite number", node.start_mark)
    return value


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> MarkedDict:
    own: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue
        k = loader.construct_object(key_node, deep=True)
        if k in own:
            raise yaml.constructor.ConstructorError(
                "in the mapping starting here",
                node.start_mark,
                f"duplicate key {k!r} (first at line {own[k]})",
                key_node.start_mark,
            )
        own[k] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    out = MarkedDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool) and key is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"unhashable or complex key {key!r}", key_node.start_mark
            )
        skey = key if isinstance(key, str) else str(key)
        out[skey] = loader.construct_object(value_node, deep=True)
        out.key_lines[skey] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> MarkedList:
    out = MarkedList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)
_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def load_marked(text: str) -> Any:
    """Parse YAML into MarkedDict/MarkedList (plain scalars otherwise). Raises yaml.YAMLError."""
    return yaml.load(text, Loader=_Loader)


def line_of(container: Any, key: str | int) -> int:
    if isinstance(container, MarkedDict) and isinstance(key, str):
        return container.line_of(key)
    if isinstance(container, MarkedList) and isinstance(key, int):
        return container.line_of(key)
    return getattr(container, "line", 0)


# Let config.raw (or parts of it) be dumped back to YAML like plain dicts and lists.
yaml.SafeDumper.add_representer(MarkedDict, yaml.representer.SafeRepresenter.represent_dict)
yaml.SafeDumper.add_representer(MarkedList, yaml.representer.SafeRepresenter.represent_list)
