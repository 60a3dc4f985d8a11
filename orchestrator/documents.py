"""Decoding a job document (JSON or YAML) without letting it blow up the server. Pure module.

Every text that becomes a spec goes through here: the REST submit route, `meshyard submit`,
`python -m workers.launch --spec`. Hostile inputs that fit easily in the 1 MiB body limit,
each a 422 here:

* YAML aliases that expand exponentially when the spec is stored (`a: &a [x, x]`, ...);
* nesting deep enough to exhaust Python's recursion limit;
* numbers that no column or field can hold: integers past 64 bits (and digit strings long
  enough to cost real CPU to convert), NaN and Infinity (JSON `NaN`, YAML `.nan`), which
  PostgreSQL's JSON refuses and no spec field means;
* NUL characters, which no text column can store.

Problems inside the document name their path (`model.kwargs.n`), like a spec field error.
"""

from __future__ import annotations

import json
import math
from typing import Any

import yaml

from orchestrator.limits import INT64_MAX
from orchestrator.spec import FieldIssue, JobSpec, SpecValidationError, parse_spec

MAX_DEPTH = 32  # a JobSpec is ~4 levels deep; model.kwargs gets the rest
MAX_INT_DIGITS = 40  # far past 64 bits; int() of longer digit strings gets costly


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in job specs; write the value out",
                mark)
        return super().compose_node(parent, index)


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
    try:
        data = yaml.load(text, Loader=_NoAliasLoader) if yaml_body else \
            json.loads(text, parse_int=_bounded_int)
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
