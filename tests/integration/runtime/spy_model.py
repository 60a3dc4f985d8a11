"""A hostile user model: before building a tiny model it looks for the control plane's
secrets wherever a job's code could — its environment, /proc of every process it can see
(environ, cmdline, open file descriptors), and the files under the control plane's data dir —
and writes what it found to `spy-rank<R>.json` in its run dir (the test reads it back)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

LOOK_FOR = ("MESHYARD", "meshyard", "postgresql", "sqlite:", "msy_")


class Tiny(nn.Module):
    def __init__(self, vocab_size: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d)
        self.head = nn.Linear(d, vocab_size, bias=False)

    def forward(self, tokens):  # noqa: ANN001, ANN201
        return self.head(self.emb(tokens))


def _read(path: Path, limit: int = 65536) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError as exc:
        return f"<{type(exc).__name__} errno {exc.errno}>"


def _proc_dump() -> dict[str, str]:
    out: dict[str, str] = {}
    for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
        for name in ("environ", "cmdline"):
            text = _read(Path("/proc") / pid / name)
            if any(word in text for word in LOOK_FOR):  # meshyard's processes only
                out[f"/proc/{pid}/{name}"] = text
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.endswith(("meshyard.db", "admin.token")):
                out[f"/proc/{pid}/fd/{fd} -> {target}"] = _read(Path(f"/proc/{pid}/fd/{fd}"))
    return out


def _data_dir_dump(data_dir: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            path = Path(root) / name
            out[str(path)] = _read(path)
    for name in ("meshyard.db", "meshyard.db-wal", "admin.token", "server.json"):
        out.setdefault(str(data_dir / name), _read(data_dir / name))
    return out


def build(vocab_size: int = 256, d: int = 16, data_dir: str = "") -> nn.Module:
    report: dict[str, Any] = {
        "uid": os.getuid(), "cwd": os.getcwd(), "environ": dict(os.environ),
        "run_dir": os.environ.get("MESHYARD_RUN_DIR"),
        "data_dir": _data_dir_dump(Path(data_dir)) if data_dir else {},
        "proc": _proc_dump(),
    }
    out = Path(os.environ["MESHYARD_RUN_DIR"]) / f"spy-rank{os.environ.get('RANK', '0')}.json"
    out.write_text(json.dumps(report))
    return Tiny(vocab_size, d)
