"""Decoding a job document (JSON or YAML) without letting it blow up the server. Pure module.

Every text that becomes a spec goes through here: the REST submit route, `meshyard submit`,
`python -m workers.loop.launch --spec`. Hostile inputs that fit easily in the 1 MiB body limit,
each a 422 here:

* YAML aliases that expand exponentially when the spec is stored (`a: &a [x, x]`, ...);
* nesting deep enough to exhaust Python's recursion limit, or to make PyYAML's scanner
  quadratic (2 KB of `[[[[...` cost a second of CPU);
* more items than a spec can mean: the parsers build a Python object per item (about 4 us
  each for YAML, 1 us for JSON), so a 1 MiB list of `1,1,1,...` cost seconds;
* numbers that no column or field can hold: integers past 64 bits (and digit strings long
  enough to cost real CPU to convert, YAML's base-60 `1:2:3:...` included), NaN and Infinity
  (JSON `NaN`, YAML `.nan`), which PostgreSQL's JSON refuses and no spec field means;
* NUL characters, which no text column can store.

Nesting and size are bounded on the raw text before any parser runs (`raw_issue`: a few
linear passes at C speed, conservative: brackets inside quoted strings count too); YAML is
then parsed by libyaml (PyYAML's C parser, when present), aliases are refused before the
document is built, and the decoded document is walked once more for depth and values.
Problems inside the document name their path (`model.kwargs.n`), like a spec field error.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

import yaml

from orchestrator.bounds.limits import INT64_MAX
from orchestrator.spec import FieldIssue, JobSpec, SpecValidationError, parse_spec

MAX_DEPTH = 32  # a JobSpec is ~4 levels deep; model.kwargs gets the rest
MAX_INT_DIGITS = 40  # far past 64 bits; int() of longer digit strings gets costly
# Items (scalars and collections) a document may hold, estimated from the raw text: a
# spec has a few hundred; the largest (4,096 avoid_nodes) about 8,200 in block YAML.
MAX_YAML_ITEMS = 10_000
MAX_JSON_ITEMS = 25_000
MAX_INDENT = 4 * MAX_DEPTH  # columns of block indentation and `- ` / `? ` markers on a line

# A line's indentation with its `- ` / `? ` markers (any dash or question mark counts), at
# most MAX_INDENT + 1 characters of it: one character class, matched at C speed.
_BLOCK_PREFIX = re.compile(rf"^[ \t?-]{{0,{MAX_INDENT + 1}}}", re.MULTILINE)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
MAX_RESOLVED_CHARS = 256
_DIGITS = re.compile(r"[-+]?[0-9_]+")
_INT_TAG, _STR_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:str"
_SCALAR = yaml.ScalarNode
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
# PyYAML's C parser when it has one (its wheels do): the pure-Python scanner costs ~0.4 us
# per byte and ~30 us per item.
_Parser: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Parser):  # type: ignore[misc, valid-type]
    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        """A plain scalar longer than MAX_RESOLVED_CHARS is a string, or an integer when it
        is all digits (refused, past 64 bits): PyYAML's float pattern costs ~40 ns a
        character (40 ms a MiB), and no spec field takes a number written that long."""
        if kind is _SCALAR and implicit[0] and len(value) > MAX_RESOLVED_CHARS:
            return _INT_TAG if _DIGITS.fullmatch(value) else _STR_TAG
        return super().resolve(kind, value, implicit)

    def construct_yaml_int(self, node: Any) -> int:
        text = str(node.value).replace("_", "").lstrip("+-")
        if len(text) > MAX_INT_DIGITS:  # also base 60 (`1:2:3:...`), quadratic to convert
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(text)} characters; integers are at most "
                "64-bit", node.start_mark)
        return int(super().construct_yaml_int(node))


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def _items(text: str, *, yaml_body: bool) -> int:
    """An upper estimate of the items (scalars and collections) in the document: one per
    separator, opening bracket, line and key, each counted at C speed."""
    n = 1 + text.count(",") + text.count("[") + text.count("{")
    if yaml_body:
        return n + text.count("\n") + text.count(": ") + text.count("- ") + text.count("? ")
    return n + text.count(":")


def raw_issue(text: str, *, yaml_body: bool) -> FieldIssue | None:
    """Why `text` is refused before parsing, or None. Linear in its length; conservative
    (brackets and separators inside quoted strings count too).

    >>> raw_issue("[" * 40, yaml_body=False).msg
    'nested deeper than 32 levels'
    """
    limit = MAX_YAML_ITEMS if yaml_body else MAX_JSON_ITEMS
    brackets = _NOT_BRACKET.sub("", text)
    # The running depth over the first 2 x limit brackets: past those the body is refused
    # for its size anyway, and this stays a few milliseconds.
    steps = map(_DEPTH_STEP.__getitem__, brackets[:2 * limit])
    if max(accumulate(steps), default=0) > MAX_DEPTH:
        return FieldIssue("<root>", f"nested deeper than {MAX_DEPTH} levels", "too_deep")
    if _items(text, yaml_body=yaml_body) > limit or len(brackets) > 2 * limit:
        return FieldIssue("<root>", f"more than {limit} items (values, keys, list entries); a "
                          "job spec holds a few hundred" + (", send a larger one as JSON"
                                                            if yaml_body else ""), "too_large")
    if yaml_body and max(map(len, _BLOCK_PREFIX.findall(text)), default=0) > MAX_INDENT:
        return FieldIssue("<root>", f"a line indented more than {MAX_INDENT} columns (or as "
                          f"many list markers); a spec nests at most {MAX_DEPTH} levels",
                          "too_deep")
    return None


def _check_no_alias(root: Any) -> None:
    """An alias is a node reached twice from the root: refused before anything is built."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in job specs; write the value out",
                node.start_mark)
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(n for pair in node.value for n in pair)


def _load_yaml(text: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if "&" in text:  # no anchor, no alias
            _check_no_alias(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-+")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer with {len(text)} digits; integers are at most 64-bit")
    return int(text)


def _value_problem(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not -INT64_MAX - 1 <= value <= INT64_MAX:
        return f"integer {value} does not fit in 64 bits; no field takes numbers this large"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a number any field accepts; send a finite number"
    if isinstance(value, str) and "\x00" in value:
        return "contains a NUL character, which cannot be stored; remove it"
    return None


def _path(parts: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in parts) or "<root>"


def document_issue(data: Any, *, max_depth: int = MAX_DEPTH) -> FieldIssue | None:
    """The first value no field can take (with its path), or None. Iterative: any depth."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        item, path = stack.pop()
        if len(path) >= max_depth:
            return FieldIssue("<root>", f"nested deeper than {max_depth} levels", "too_deep")
        if isinstance(item, dict):
            for key, value in item.items():
                if (msg := _value_problem(key)) is not None:
                    return FieldIssue(_path((*path, "<key>")), msg, "value_error")
                stack.append((value, (*path, key)))
        elif isinstance(item, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(item))
        elif (msg := _value_problem(item)) is not None:
            return FieldIssue(_path(path), msg, "value_error")
    return None


def _fail(msg: str, kind: str = "parse_error") -> SpecValidationError:
    return SpecValidationError([FieldIssue("<root>", msg, kind)])


def parse_document(text: str, *, yaml_body: bool) -> Any:
    """Returns the decoded document or raises SpecValidationError (422)."""
    kind = "YAML" if yaml_body else "JSON"
    if "\x00" in text:
        raise _fail(f"invalid {kind}: the body contains a NUL character")
    issue = raw_issue(text, yaml_body=yaml_body)
    if issue is not None:
        raise SpecValidationError([issue])
    try:
        data = _load_yaml(text) if yaml_body else json.loads(text, parse_int=_bounded_int)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise _fail(f"invalid {kind}: {exc}") from None
    except RecursionError:
        raise _fail(f"invalid {kind}: nested deeper than {MAX_DEPTH} levels",
                    "too_deep") from None
    except ValueError as exc:  # int() of an over-long digit string (YAML, or JSON's hook)
        raise _fail(f"invalid {kind}: {exc}") from None
    issue = document_issue(data)
    if issue is not None:
        raise SpecValidationError([issue])
    return data


def is_yaml(content_type: str) -> bool:
    return "yaml" in content_type or "yml" in content_type


def parse_spec_text(text: str, *, content_type: str = "application/yaml") -> JobSpec:
    """A JobSpec from JSON or YAML text; SpecValidationError for syntax and field errors."""
    return parse_spec(parse_document(text, yaml_body=is_yaml(content_type)))
