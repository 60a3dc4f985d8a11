"""`meshyard logs` prints a rank's lines without terminal control sequences (`--raw`: as
written), whether it lists or follows."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from api.cli import log_cmds
from api.cli.app import app

LINES = [{"id": 1, "rank": 0, "stream": "stdout",
          "line": "ok\x1b]52;c;cm0gLXJmIH4K\x07 step 1\x1b]0;pwned\x07"},
         {"id": 2, "rank": 1, "stream": "stderr",
          "line": "fine\r\x1b[1A\x1b[2K\x9b2J[rank 0 stdout] all done"}]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> None:
    def get(url: str, **kwargs: Any) -> httpx.Response:
        return httpx.Response(200, json={"items": LINES}, request=httpx.Request("GET", url))

    monkeypatch.setattr(log_cmds.httpx, "get", get)

    client = httpx.Client

    def follow(*args: Any, **kwargs: Any) -> httpx.Client:
        body = "".join(json.dumps(x) + "\n" for x in LINES)
        transport = httpx.MockTransport(lambda request: httpx.Response(200, text=body))
        return client(transport=transport, base_url="http://meshyard.test")

    monkeypatch.setattr(log_cmds.httpx, "Client", follow)


@pytest.mark.parametrize("follow", [[], ["--follow"]])
def test_logs_strip_control_sequences(served: None, follow: list[str]) -> None:
    out = CliRunner().invoke(app, ["logs", "job-1", "--url", "http://meshyard.test",
                                   "--token", "t", *follow])
    assert out.exit_code == 0, out.output
    assert out.output == ("[rank 0 stdout] ok step 1\n"
                          "[rank 1 stderr] fine[rank 0 stdout] all done\n")


def test_logs_raw_prints_what_the_rank_wrote(served: None) -> None:
    out = CliRunner().invoke(app, ["logs", "job-1", "--url", "http://meshyard.test",
                                   "--token", "t", "--raw"])
    assert out.exit_code == 0, out.output
    assert "\x1b]52;c;" in out.output and "\x9b2J" in out.output
