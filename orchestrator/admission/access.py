"""Who may do what: roles, and the deployment policy on the code and data a job may use.

Pure. The API asks before it stores a job; every answer is a decision — nothing, or a
`Violation` that names the policy and the setting an operator changes to allow it.

    admin   everything: every user's jobs, tokens, roles and quotas; jobs that are never
            preempted (`preemption.preemptible: false`)
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

from orchestrator.spec import SpecKind

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

    code_roles: frozenset[Role]  # roles whose jobs may run their own code (import, entrypoint)
    import_prefixes: tuple[str, ...]  # allowed module prefixes; empty: any module
    data_roots: tuple[str, ...]  # absolute directories data.path must lie under
    working_dir_roots: tuple[str, ...] = ()  # directories an entrypoint's path may lie under
    # isolated mode (orchestrator/isolation/modes.py): user code runs confined, so a non-admin's
    # imported model (which runs unconfined, in the worker) needs an import allowlist
    isolated: bool = False


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


def _code_role(role: Role, policy: Policy, *, loc: str, what: str) -> Violation | None:
    if role in policy.code_roles:
        return None
    allowed = ", ".join(sorted(policy.code_roles)) or "none"
    return Violation("code_roles", "MESHYARD_CODE_ROLES", loc,
                     f"role {role.value} may not run its own code ({what}); roles allowed: "
                     f"{allowed}. Use the built-in model, or ask an operator to add "
                     f"{role.value} to MESHYARD_CODE_ROLES", forbidden=True)


def entrypoint_violations(spec: JobSpec, *, role: Role, policy: Policy) -> list[Violation]:
    """User code: who may run it, which modules a function may come from (a command cannot
    be checked, so a deployment that restricts imports refuses commands), which paths a
    working dir may name (checked lexically, like data paths)."""
    ep = spec.entrypoint
    if ep is None:
        return []
    out = [v for v in [_code_role(role, policy, loc="entrypoint", what="entrypoint")] if v]
    prefixes = policy.import_prefixes
    if ep.module is not None and not module_allowed(ep.module, prefixes):
        out.append(Violation(
            "allowed_import_prefixes", "MESHYARD_ALLOWED_IMPORT_PREFIXES", "entrypoint.function",
            f"module {ep.module!r} is not under an allowed import prefix {list(prefixes)}; "
            "use one of them, or ask an operator to add it to MESHYARD_ALLOWED_IMPORT_PREFIXES"))
    if ep.command is not None and prefixes:
        out.append(Violation(
            "allowed_import_prefixes", "MESHYARD_ALLOWED_IMPORT_PREFIXES", "entrypoint.command",
            f"this deployment allows only code from the import prefixes {list(prefixes)}, and a "
            "command can run anything; use entrypoint.function, or ask an operator to clear "
            "MESHYARD_ALLOWED_IMPORT_PREFIXES"))
    wd = ep.working_dir
    if wd is not None and ep.package is None and not path_under(wd, policy.working_dir_roots):
        out.append(Violation(
            "working_dir_roots", "MESHYARD_WORKING_DIR_ROOTS", "entrypoint.working_dir",
            f"working_dir {wd!r} is not under an allowed working-dir root "
            f"{list(policy.working_dir_roots)}; upload the code instead (`meshyard submit SPEC "
            "--working-dir DIR`), or ask an operator to add its directory to "
            "MESHYARD_WORKING_DIR_ROOTS"))
    return out


def isolation_violations(spec: JobSpec, *, role: Role, policy: Policy,
                         code_refusal: str | None = None) -> list[Violation]:
    """Isolated mode, for non-admins: no code at all while the host cannot confine it
    (`code_refusal` says why), and no imported model without an import allowlist."""
    has_code = spec.kind is SpecKind.USER_CODE or spec.model.kind == "import"
    if role == Role.ADMIN or not has_code:
        return []
    if code_refusal:
        loc = "entrypoint" if spec.kind is SpecKind.USER_CODE else "model.kind"
        return [Violation("isolation", "MESHYARD_ISOLATION", loc, code_refusal,
                          forbidden=True)]
    if policy.isolated and spec.kind is SpecKind.BUILT_IN and not policy.import_prefixes:
        return [Violation(
            "isolation", "MESHYARD_ALLOWED_IMPORT_PREFIXES", "model.kind",
            "an imported model (model.kind: import) runs inside the worker process, which "
            "isolated mode does not confine, so this deployment takes it only from the "
            "packages an operator installed (MESHYARD_ALLOWED_IMPORT_PREFIXES, unset here); "
            "run your model as user code instead (entrypoint.function runs confined)",
            forbidden=True)]
    return []


def spec_violations(spec: JobSpec, *, role: Role, policy: Policy,
                    code_refusal: str | None = None) -> list[Violation]:
    """What in `spec` this deployment does not allow for a caller with `role`."""
    out = isolation_violations(spec, role=role, policy=policy, code_refusal=code_refusal)
    if not spec.preemption.preemptible and role != Role.ADMIN:
        out.append(Violation(
            "roles", "the user's role", "preemption.preemptible",
            f"role {role.value} may not mark a job preemptible: false (only admins may: a job "
            "no one can stop holds its GPUs against every higher-priority job); leave it "
            "true, or ask an admin to submit the job", forbidden=True))
    if spec.entrypoint is not None:
        return out + entrypoint_violations(spec, role=role, policy=policy)
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
    path = getattr(spec.data, "path", None)
    if path is not None and not path_under(path, policy.data_roots):
        out.append(Violation(
            "data_roots", "MESHYARD_DATA_ROOTS", "data.path",
            f"data.path {path!r} is not an absolute path under an allowed data root "
            f"{list(policy.data_roots)}; put the file under one of them, or ask an operator "
            "to add its directory to MESHYARD_DATA_ROOTS"))
    return out
