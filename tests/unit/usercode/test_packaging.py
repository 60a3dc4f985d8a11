"""Shipping code: a working dir -> a deterministic zip with .gitignore-style excludes and a
size cap that names the largest files; the node zip puts everything under meshyard-code/;
the Ray Train example differs from Ray Train's own version in its imports only."""

from __future__ import annotations

import difflib
import zipfile
from pathlib import Path

import pytest

from api.packaging import PackageTooLargeLocal, build_package
from orchestrator.usercode.packages import (
    CODE_DIR,
    PackageError,
    PackageWriter,
    check_zip,
    ray_package,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "byo"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_excludes_follow_gitignore_rules_per_directory(tmp_path: Path) -> None:
    root = _tree(tmp_path / "proj", {
        "train.py": "x", ".gitignore": "*.log\ndata/\n!keep.log\n", "keep.log": "k",
        "run.log": "r", "data/shard.bin": "b", "pkg/__init__.py": "", "pkg/.gitignore": "gen/\n",
        "pkg/gen/out.py": "o", "pkg/model.py": "m", ".meshyardignore": "secrets.env\n",
        "secrets.env": "s", ".git/HEAD": "h", "pkg/__pycache__/m.cpython-311.pyc": "c",
        ".venv/bin/python": "p"})
    local = build_package(root, max_bytes=10**6)
    assert local.files == (".gitignore", ".meshyardignore", "keep.log", "pkg/.gitignore",
                           "pkg/__init__.py", "pkg/model.py", "train.py")
    with zipfile.ZipFile(__import__("io").BytesIO(local.data)) as zf:
        assert zf.read("pkg/model.py") == b"m"


def test_the_same_tree_gives_the_same_package(tmp_path: Path) -> None:
    a = _tree(tmp_path / "a", {"train.py": "print(1)", "lib/u.py": "u"})
    b = _tree(tmp_path / "b", {"lib/u.py": "u", "train.py": "print(1)"})
    assert build_package(a, max_bytes=10**6).digest == build_package(b, max_bytes=10**6).digest
    (b / "train.py").write_text("print(2)")
    assert build_package(a, max_bytes=10**6).digest != build_package(b, max_bytes=10**6).digest


def test_an_oversize_tree_is_refused_naming_its_largest_files(tmp_path: Path) -> None:
    root = _tree(tmp_path / "p", {"train.py": "x"})
    (root / "weights.bin").write_bytes(b"\0" * 300_000)
    with pytest.raises(PackageTooLargeLocal, match=r"weights\.bin \(0\.3 MiB\).*\.gitignore"):
        build_package(root, max_bytes=100_000)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        build_package(tmp_path / "missing", max_bytes=100_000)


def test_the_node_zip_holds_the_code_one_folder_down(tmp_path: Path) -> None:
    local = build_package(_tree(tmp_path / "p", {"workers/__init__.py": "", "t.py": "x"}),
                          max_bytes=10**6)
    w = PackageWriter(tmp_path / "store", max_bytes=10**6, max_unpacked_bytes=10**7)
    w.write(local.data)
    info = w.finish()
    node = ray_package(tmp_path / "store", info.digest)
    with zipfile.ZipFile(node) as zf:
        names = zf.namelist()
    # Ray puts the unpacked root first on the worker's PYTHONPATH: nothing importable there.
    assert names == [f"{CODE_DIR}/", f"{CODE_DIR}/t.py", f"{CODE_DIR}/workers/__init__.py"]
    assert ray_package(tmp_path / "store", info.digest).read_bytes() == node.read_bytes()


def test_zip_bombs_are_refused_from_the_central_directory(tmp_path: Path) -> None:
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.bin", b"\0" * 2_000_000)
    assert path.stat().st_size < 10_000
    with pytest.raises(PackageError, match="unpack to more than"):
        check_zip(path, max_unpacked_bytes=1_000_000)


def test_the_ray_train_port_changes_imports_only() -> None:
    ray_src = (EXAMPLES / "raytrain" / "train_ray.py").read_text()
    ours = (EXAMPLES / "raytrain" / "train.py").read_text()
    body = lambda s: s.split('"""', 2)[2]  # noqa: E731 - past the docstring
    ray_loop = body(ray_src).split('\n\nif __name__ == "__main__":')[0]
    changed = [line for line in difflib.ndiff(ray_loop.splitlines(), body(ours).splitlines())
               if line[:1] in "+-" and line[2:].strip()]
    assert changed and all("ray.train" in c or "meshyard.train" in c for c in changed), changed
    assert ray_loop.replace("ray.train", "meshyard.train").strip() == body(ours).strip()
