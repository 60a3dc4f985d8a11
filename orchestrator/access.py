"""Who may do what: roles, and the deployment policy on the code and data a job may use.

Pure. The API asks before it stores a job; every answer is a decision — nothing, or a
`Violation` that names the policy and the setting an operator changes to allow it.

    admin   everything: every user's jobs, tokens, roles and quotas
    user    submits and cancels their own jobs (so runs code, where the policy allows it),
            reads their own jobs, manages their own tokens
    viewer  reads every job, changes nothing (their own tokens aside)

>>> policy = Policy(code_roles=frozenset({Role.ADMIN}), import_prefixes=(), data_roots=())
>>> may_submit(Role.VIEWER).policy
'roles'
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.spec import JobSpec


class Role(StrEnum):
    ADMIN = "admin"
    USER = "user"
    VIEWER = "viewer"


ROLE_ORDER = (Role.ADMIN, Role.USER, Role.VIEWER)


@dataclass(frozen=True)
class Policy:
    """The deployment's answer to "which code and which files may a job use"."""

    code_roles: frozenset[Role]  # roles whose jobs may import code (model.kind: import)
    import_prefixes: tuple[str, ...]  # allowed module prefixes; empty: any module
    data_roots: tuple[str, ...]  # absolute directories data.path must lie under


@dataclass(frozen=True)
class Violation:
    """A refused request. `forbidden`: the caller's role is the problem (403); otherwise the
    spec asks for something the deployment does not allow (422 at `loc`)."""

    policy: str
    setting: str
    loc: str
    msg: str
    forbidden: bool = False


def may_submit(role: Role) -> Violation | None:
    """Viewers read; only admins and users create or cancel jobs."""
    if role == Role.VIEWER:
        return Violation("roles", "the user's role", "<root>",
                         "role viewer is read-only: it may not submit or cancel jobs; an admin "
                         "can give this user the role user (`meshyard user role NAME user`)",
                         forbidden=True)
    return None


def module_allowed(module: str, prefixes: tuple[str, ...]) -> bool:
    """`torchvision` allows `torchvision` and `torchvision.models`, not `torchvision_evil`.

    >>> module_allowed("mylab.models.gpt", ("mylab",)), module_allowed("mylabx", ("mylab",))
    (True, False)
    """
    if not prefixes:
        return True
    return any(module == p.rstrip(".") or module.startswith(p.rstrip(".") + ".")
               for p in prefixes)


def path_under(path: str, roots: tuple[str, ...]) -> bool:
    """Lexically: an absolute path whose normal form lies under one of the roots.

    >>> path_under("/d/datasets/../meshyard.db", ("/d/datasets",))
    False
    """
    if not posixpath.isabs(path):
        return False
    norm = posixpath.normpath(path)
    for root in roots:
        r = posixpath.normpath(root)
        if norm == r or norm.startswith(r.rstrip("/") + "/"):
            return True
    return False


def spec_violations(spec: JobSpec, *, role: Role, policy: Policy) -> list[Violation]:
    """What in `spec` this deployment does not allow for a caller with `role`."""
    out: list[Violation] = []
    if spec.model.kind == "import":
        if role not in policy.code_roles:
            allowed = ", ".join(sorted(policy.code_roles)) or "none"
            out.append(Violation(
                "code_roles", "MESHYARD_CODE_ROLES", "model.kind",
                f"role {role.value} may not run imported code (model.kind: import); roles "
                f"allowed: {allowed}. Use the built-in model, or ask an operator to add "
                f"{role.value} to MESHYARD_CODE_ROLES", forbidden=True))
        module = spec.model.path.partition(":")[0]
        if not module_allowed(module, policy.import_prefixes):
            out.append(Violation(
                "allowed_import_prefixes", "MESHYARD_ALLOWED_IMPORT_PREFIXES", "model.path",
                f"module {module!r} is not under an allowed import prefix "
                f"{list(policy.import_prefixes)}; use one of them, or ask an operator to add "
                "its package to MESHYARD_ALLOWED_IMPORT_PREFIXES"))
    if spec.data.kind == "text_file" and not path_under(spec.data.path, policy.data_roots):
        out.append(Violation(
            "data_roots", "MESHYARD_DATA_ROOTS", "data.path",
            f"data.path {spec.data.path!r} is not an absolute path under an allowed data root "
            f"{list(policy.data_roots)}; put the file under one of them, or ask an operator "
            "to add its directory to MESHYARD_DATA_ROOTS"))
    return out
