"""Decoding a job document (JSON or YAML) without letting it blow up the server. Pure module.

Every text that becomes a spec goes through here: the REST submit route, `meshyard submit`,
`python -m workers.launch --spec`.

Two hostile inputs fit easily in the 1 MiB body limit: YAML aliases that expand
exponentially when the spec is stored (`a: &a [x, x]`, `b: &b [*a, *a]`, ...), and nesting deep
enough to exhaust Python's recursion limit. Job specs need neither, so both are 422s.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from orchestrator.spec import FieldIssue, JobSpec, SpecValidationError, parse_spec

MAX_DEPTH = 32  # a JobSpec is ~4 levels deep; model.kwargs gets the rest


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in job specs; write the value out",
                mark)
        return super().compose_node(parent, index)


def _depth_ok(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return True


def _fail(msg: str, kind: str = "parse_error") -> SpecValidationError:
    return SpecValidationError([FieldIssue("<root>", msg, kind)])


def parse_document(text: str, *, yaml_body: bool) -> Any:
    """Returns the decoded document or raises SpecValidationError (422) at loc `<root>`."""
    kind = "YAML" if yaml_body else "JSON"
    try:
        data = yaml.load(text, Loader=_NoAliasLoader) if yaml_body else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise _fail(f"invalid {kind}: {exc}") from None
    except RecursionError:
        raise _fail(f"invalid {kind}: nested deeper than {MAX_DEPTH} levels",
                    "too_deep") from None
    if not _depth_ok(data, MAX_DEPTH):
        raise _fail(f"invalid {kind}: nested deeper than {MAX_DEPTH} levels", "too_deep")
    return data


def is_yaml(content_type: str) -> bool:
    return "yaml" in content_type or "yml" in content_type


def parse_spec_text(text: str, *, content_type: str = "application/yaml") -> JobSpec:
    """A JobSpec from JSON or YAML text; SpecValidationError for syntax and field errors."""
    return parse_spec(parse_document(text, yaml_body=is_yaml(content_type)))
