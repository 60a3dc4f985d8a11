"""Submitted documents: hostile YAML aliases and deep nesting are 422s, not OOMs or 500s."""

from __future__ import annotations

import pytest

from orchestrator.documents import MAX_DEPTH, parse_document
from orchestrator.spec import SpecValidationError

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi",
                                                                 strict=True))


def test_plain_documents_decode() -> None:
    assert parse_document('{"name": "a", "training": {"steps": 3}}', yaml_body=False) == \
        {"name": "a", "training": {"steps": 3}}
    assert parse_document("name: a\ntraining:\n  steps: 3\n", yaml_body=True) == \
        {"name": "a", "training": {"steps": 3}}


def test_yaml_aliases_are_refused_before_expansion() -> None:
    with pytest.raises(SpecValidationError) as err:
        parse_document(BOMB, yaml_body=True)
    issue = err.value.issues[0]
    assert issue.loc == "<root>" and "aliases" in issue.msg


@pytest.mark.parametrize(("text", "yaml_body"), [
    ("[" * 100_000, False),
    ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), False),
    ("a: " + "[" * 50_000, True),
    ("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), True),
])
def test_deep_nesting_is_refused(text: str, yaml_body: bool) -> None:
    with pytest.raises(SpecValidationError) as err:
        parse_document(text, yaml_body=yaml_body)
    assert err.value.issues[0].loc == "<root>"
    assert "nested deeper" in err.value.issues[0].msg or "invalid" in err.value.issues[0].msg


def test_syntax_errors_name_the_format() -> None:
    with pytest.raises(SpecValidationError, match="invalid JSON"):
        parse_document("{nope", yaml_body=False)
    with pytest.raises(SpecValidationError, match="invalid YAML"):
        parse_document("name: [unclosed", yaml_body=True)
