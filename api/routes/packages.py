"""/v1/packages: upload the code of a user-code job (a zip), content-addressed.

    curl -sS -X POST $U/v1/packages -H "$H" -H 'Content-Type: application/zip' \
         --data-binary @code.zip          # -> {"package": "package:sha256:<hex>", ...}
    curl -sS $U/v1/packages/<hex> -H "$H"  # 200 when you uploaded it, 404 otherwise

The body is streamed to disk (hashed on the way) and refused past MESHYARD_MAX_PACKAGE_BYTES
(413); the zip is checked whole before it is kept (orchestrator/usercode/packages.py), off the event
loop. Uploading code is running code: the caller's role must be allowed to
(MESHYARD_CODE_ROLES).

A package is its uploaders' own: the store records who sent which digest, a spec may name only
a package its submitter uploaded (admins: any), and a package is 404 to everyone else. So that
nobody learns whether someone else sent the same bytes, the first upload by each user answers
201 (`created: true`) whether or not the bytes were stored already; only the same user's
repeat answers 200.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from api.admission import may_use_package
from api.deps import SettingsDep, StoreDep, WriterDep
from api.errors import ApiError, NotFound, PolicyRefused, Unprocessable
from api.responses import model_response
from api.schemas import Package
from orchestrator.admission.access import Role, Violation
from orchestrator.settings import Settings
from orchestrator.spec import FieldIssue
from orchestrator.usercode.entrypoint import package_ref
from orchestrator.usercode.packages import (
    PackageError,
    PackageInfo,
    PackageTooLarge,
    PackageWriter,
    package_path,
)

router = APIRouter(prefix="/v1/packages", tags=["packages"])
ZIP_TYPES = ("application/zip", "application/x-zip-compressed", "application/octet-stream")
PREFIX = "/v1/packages"
UNPACKED_FACTOR = 8  # a zip may unpack to at most this many times the package cap

UPLOAD_DOC = {"requestBody": {"required": True, "description": "A zip of the code directory.",
                              "content": {"application/zip": {"schema": {"type": "string",
                                                                         "format": "binary"}}}}}


def _check_code_role(role: Role, settings: Settings) -> None:
    policy = settings.policy()
    if role not in policy.code_roles:
        allowed = ", ".join(sorted(policy.code_roles)) or "none"
        raise PolicyRefused([Violation(
            "code_roles", "MESHYARD_CODE_ROLES", "<root>",
            f"role {role.value} may not run its own code, so it may not upload packages; "
            f"roles allowed: {allowed}", forbidden=True)])


def _out(info: PackageInfo, *, created: bool) -> Package:
    return Package(package=package_ref(info.digest), sha256=info.digest, bytes=info.size,
                   created=created)


@router.post("", operation_id="uploadPackage", response_model=Package, status_code=201,
             openapi_extra=UPLOAD_DOC)
async def upload_package(request: Request, user: WriterDep, settings: SettingsDep,
                         store: StoreDep) -> Response:
    _check_code_role(user.role, settings)
    kind = request.headers.get("content-type", "application/zip").split(";")[0].strip().lower()
    if kind not in ZIP_TYPES:
        raise ApiError(415, f"unsupported Content-Type {kind!r}; send the zip as "
                       "application/zip")
    cap = settings.max_package_bytes
    writer = PackageWriter(settings.packages_dir, max_bytes=cap,
                           max_unpacked_bytes=UNPACKED_FACTOR * cap)
    try:
        async for chunk in request.stream():
            writer.write(chunk)
        info = await run_in_threadpool(writer.finish)
    except PackageTooLarge:
        raise ApiError(413, f"package is larger than the limit of {cap} bytes "
                       "(MESHYARD_MAX_PACKAGE_BYTES); leave data and checkpoints out") from None
    except PackageError as exc:
        loc = "<body>" if exc.entry is None else f"<body>/{exc.entry}"
        raise Unprocessable([FieldIssue(loc, str(exc), "package_error")]) from None
    finally:
        writer.abort()  # no-op after finish
    created = await run_in_threadpool(store.add_package_owner, info.digest, user.name)
    return model_response(_out(info, created=created), status_code=201 if created else 200,
                          headers={"Location": f"{PREFIX}/{info.digest}"})


@router.get("/{sha256}", operation_id="getPackage", response_model=Package)
def get_package(sha256: Annotated[str, Path(pattern=r"^[0-9a-f]{64}$",
                                             description="SHA-256 of the zip.")],
                user: WriterDep, settings: SettingsDep, store: StoreDep) -> Response:
    """Another user's package is 404, like one never uploaded."""
    if not may_use_package(store, user, sha256, packages_dir=settings.packages_dir):
        raise NotFound(f"package sha256:{sha256} is not uploaded to this server by you; "
                       f"upload it (POST {PREFIX})")
    size = package_path(settings.packages_dir, sha256).stat().st_size
    return model_response(Package(package=package_ref(sha256), sha256=sha256, bytes=size,
                                  created=False))
