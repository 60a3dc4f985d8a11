"""Pure pieces of the API: submission bodies, connection discovery, error formatting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.client import MeshyardAPIError, resolve_connection
from api.errors import Unprocessable
from api.routes.jobs import split_submission


@pytest.mark.parametrize(("data", "header", "expected"), [
    ({"name": "a"}, None, ({"name": "a"}, None)),
    ({"name": "a"}, "h", ({"name": "a"}, "h")),
    ({"spec": {"name": "a"}}, None, ({"name": "a"}, None)),
    ({"spec": {"name": "a"}, "submission_id": "k"}, None, ({"name": "a"}, "k")),
    ({"spec": {"name": "a"}, "submission_id": "k"}, "k", ({"name": "a"}, "k")),
    (["not", "a", "mapping"], None, (["not", "a", "mapping"], None)),
])
def test_split_submission_accepts_bare_and_wrapped(data, header, expected) -> None:
    assert split_submission(data, header_key=header) == expected


@pytest.mark.parametrize(("data", "header", "loc"), [
    ({"spec": {}, "submission_id": "a"}, "b", "submission_id"),
    ({"spec": {}, "submission_id": ""}, None, "submission_id"),
    ({"spec": {}, "submission_id": 7}, None, "submission_id"),
    ({"spec": {}, "submission_id": "x" * 201}, None, "submission_id"),
    ({"name": "a"}, "bad\nkey", "header.Idempotency-Key"),
    ({"spec": {}, "name": "a"}, None, "name"),
])
def test_split_submission_rejects_bad_keys(data, header, loc) -> None:
    with pytest.raises(Unprocessable) as err:
        split_submission(data, header_key=header)
    assert err.value.status_code == 422
    assert [i.loc for i in err.value.errors] == [loc]


def test_connection_prefers_flags_then_env_then_data_dir(tmp_path: Path) -> None:
    (tmp_path / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:1111"}))
    (tmp_path / "admin.token").write_text("file-token\n")
    env = {"MESHYARD_URL": "http://127.0.0.1:2222/", "MESHYARD_TOKEN": "env-token"}
    from_dir = resolve_connection(data_dir=tmp_path, env={})
    assert (from_dir.url, from_dir.token) == ("http://127.0.0.1:1111", "file-token")
    from_env = resolve_connection(data_dir=tmp_path, env=env)
    assert (from_env.url, from_env.token) == ("http://127.0.0.1:2222", "env-token")
    flags = resolve_connection(url="http://127.0.0.1:3333", token="flag", data_dir=tmp_path,
                               env=env)
    assert (flags.url, flags.token) == ("http://127.0.0.1:3333", "flag")
    nothing = resolve_connection(data_dir=tmp_path / "missing", env={})
    assert (nothing.url, nothing.token) == ("http://127.0.0.1:8470", None)


def test_api_error_message_lists_field_errors() -> None:
    err = MeshyardAPIError(422, {"detail": "invalid request", "errors": [
        {"loc": "parallelism.tp", "msg": "tp=3 does not divide model.n_heads=4"}]})
    assert str(err) == "HTTP 422: invalid request\n  parallelism.tp: tp=3 does not divide " \
                       "model.n_heads=4"
    assert err.errors[0]["loc"] == "parallelism.tp"
