"""Submitted documents: hostile YAML aliases and deep nesting are 422s, not OOMs or 500s."""

from __future__ import annotations

import pytest

from orchestrator.admission.documents import MAX_DEPTH, parse_document
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


def test_large_honest_specs_still_decode() -> None:
    """The raw bounds are conservative, not tight: the largest real specs pass them."""
    nodes = "".join(f"    - node-{i:05d}\n" for i in range(4096))  # every avoid_nodes entry
    text = ("name: big\nplacement:\n  avoid_nodes:\n" + nodes +
            "entrypoint:\n  command: [python, train.py, --lr, '3e-4', '--tags=[a, b]']\n"
            "  env:\n    CERT: |\n      -----BEGIN CERTIFICATE-----\n      MIIB\n")
    data = parse_document(text, yaml_body=True)
    assert len(data["placement"]["avoid_nodes"]) == 4096
    assert data["entrypoint"]["env"]["CERT"].startswith("-----BEGIN")


@pytest.mark.parametrize("text", [
    "base: &b {lr: 1}\nover:\n  <<: *b\n",  # a merge key is an alias too
    "a: &x 1\nb: *x\n",
])
def test_every_alias_is_refused(text: str) -> None:
    with pytest.raises(SpecValidationError, match="aliases"):
        parse_document(text, yaml_body=True)


def test_long_plain_scalars_are_strings_and_long_integers_are_refused() -> None:
    assert parse_document("v: 1." + "0" * 300, yaml_body=True) == {"v": "1." + "0" * 300}
    assert parse_document("v: 1.5\nw: 0x10\nx: 1_000\ny: 1:30\n", yaml_body=True) == \
        {"v": 1.5, "w": 16, "x": 1000, "y": 90}
    for digits in (41, 300):
        with pytest.raises(SpecValidationError, match="integers are at most 64-bit"):
            parse_document("v: " + "9" * digits, yaml_body=True)
