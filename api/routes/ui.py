"""The web dashboard's HTML routes: `/`, `/login`, `/logout`, `/submit`, `/jobs/{id}`,
`/cluster`, `/static/{file}` and artifact downloads, plus the views pages fetch that are not
/v1 resources (`/jobs/{id}/comm.json`, `/cluster.json`).

Pages are server-rendered (Jinja2, autoescaped); their live parts are drawn by the static
scripts from the /v1 API, which accepts the session cookie (see api/dashboard/session.py for
the cookie and CSRF rules). Every response here carries a strict Content-Security-Policy:
scripts and styles come only from /static, so nothing inline ever runs.
"""

from __future__ import annotations

import math
import mimetypes
import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Depends, Request
from fastapi import Path as FastPath
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from api.auth import SESSION_KEY, authenticate, bearer_token
from api.dashboard import views
from api.dashboard.session import (
    COOKIE_NAME,
    CSRF_FIELD,
    cookie_session,
    csrf_problem,
    csrf_token,
    origin_ok,
)
from api.deps import (
    RuntimeDep,
    SettingsDep,
    StoreDep,
    ThrottleDep,
    TokenCacheDep,
)
from api.errors import NotFound
from api.store_views import cluster_levels, job_goodput
from api.store_views import statuses as node_statuses
from api.throttle import client_address
from orchestrator.admission.access import may_submit
from orchestrator.bounds.limits import INT32_MAX
from orchestrator.isolation import runfiles
from orchestrator.lifecycle import Reason
from orchestrator.placement.holds import gpu_holds
from orchestrator.store.records import NodeRecord, UserRecord
from orchestrator.store.repo import Store

MAX_ARTIFACT_BYTES = 16 * 2**20
DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"
STATIC_DIR = DASHBOARD_DIR / "static"
templates = Jinja2Templates(directory=str(DASHBOARD_DIR / "templates"))
templates.env.filters.update(human_gb=views.human_gb, human_seconds=views.human_seconds)

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # "no-referrer" makes Chromium send Origin: null
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
EXAMPLE_SPEC = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
MAX_LOGIN_BODY = 4096

router = APIRouter(include_in_schema=False)


class Session:
    """The signed-in browser: its user, and the CSRF token its pages send back."""

    def __init__(self, user: UserRecord, secret: str) -> None:
        self.user = user
        self.csrf = csrf_token(secret)
        self.can_write = may_submit(user.role) is None  # submit, cancel, stacks now


class LoginRequired(Exception):
    """Raised by page dependencies; answered with a redirect to /login."""


def _session(request: Request, store: StoreDep) -> Session:
    secret = cookie_session(request)
    user = store.session_user(secret) if secret else None
    if user is None or secret is None:
        raise LoginRequired()
    return Session(user, secret)


SessionDep = Annotated[Session, Depends(_session)]


async def _reader(request: Request, store: StoreDep, cache: TokenCacheDep,
                  throttle: ThrottleDep) -> UserRecord:
    """A bearer token (scripts, curl) or the dashboard session: artifact links work with
    either. Without any credential, the browser goes to the login page."""
    if bearer_token(request) is None and cookie_session(request) is None:
        raise LoginRequired()
    return await authenticate(request, store, cache, throttle)


ReaderDep = Annotated[UserRecord, Depends(_reader)]


def _job_id(raw: str) -> str:
    """A job id as the store may be asked for it: bounded, and no control characters (which
    PostgreSQL refuses in a query) — such an id matches no job."""
    return raw[:100] if raw.isprintable() else ""


def secure(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def page(request: Request, name: str, *, status: int = 200, **context: Any) -> Response:
    response = templates.TemplateResponse(request, name, context, status_code=status)
    return secure(response)


def login_redirect(request: Request, exc: Exception) -> Response:
    return secure(RedirectResponse("/login", status_code=303))


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, store: StoreDep) -> Response:
    secret = cookie_session(request)
    if secret and store.session_user(secret):
        return secure(RedirectResponse("/", status_code=303))
    return page(request, "login.html", error=None)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, store: StoreDep, settings: SettingsDep,
                throttle: ThrottleDep) -> Response:
    """Form post (never a query string: tokens stay out of URLs and logs). Opens a server-side
    session; the cookie carries the session's secret, not the token. A bad token counts as a
    failed login of the client's address (api/throttle.py); over the limit, 429."""
    if not origin_ok(request):
        return page(request, "login.html", status=403, error="Cross-site login refused.")
    client = client_address(request)
    if (wait := throttle.retry_after(client)) is not None:
        response = page(request, "login.html", status=429, error="Too many failed logins "
                        f"from your address; try again in {wait} s.")
        response.headers["Retry-After"] = str(wait)
        return response
    body = await request.body()
    if len(body) > MAX_LOGIN_BODY:
        return page(request, "login.html", status=413, error="Token too long.")
    token = parse_qs(body.decode("utf-8", "replace")).get("token", [""])[0].strip()
    opened = await run_in_threadpool(store.open_session, token,
                                     ttl_s=settings.session_ttl_s) if token else None
    if opened is None:
        throttle.failed(client)
        return page(request, "login.html", status=401,
                    error="That token is not valid. Create one with `meshyard token create`.")
    response = RedirectResponse("/", status_code=303)
    # Max-Age is whole seconds: rounded up, so a TTL under a second is not a cookie that the
    # browser drops at once (Max-Age=0) and the cookie never ends before its session does.
    response.set_cookie(COOKIE_NAME, opened[0], max_age=math.ceil(settings.session_ttl_s),
                        path="/", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return secure(response)


@router.post("/logout")
async def logout(request: Request, store: StoreDep, cache: TokenCacheDep) -> Response:
    """Deletes the session: the cookie's secret stops working at once, even if kept."""
    secret = cookie_session(request)
    if secret is not None:
        form = parse_qs((await request.body())[:MAX_LOGIN_BODY].decode("utf-8", "replace"))
        problem = csrf_problem(request, secret, submitted=form.get(CSRF_FIELD, [""])[0])
        if problem is not None:
            return secure(Response(problem, status_code=403, media_type="text/plain"))
        await run_in_threadpool(store.close_session, secret)
        cache.forget(SESSION_KEY + secret)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
    return secure(response)


@router.get("/", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep) -> Response:
    return page(request, "jobs.html", session=session, active="jobs")


@router.get("/submit", response_class=HTMLResponse)
def submit_page(request: Request, session: SessionDep) -> Response:
    return page(request, "submit.html", session=session, active="submit",
                example=EXAMPLE_SPEC.read_text() if EXAMPLE_SPEC.is_file() else "")


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, request: Request, session: SessionDep, store: StoreDep,
             settings: SettingsDep) -> Response:
    job = store.get_job(_job_id(job_id), viewer=session.user)
    if job is None:
        return page(request, "not_found.html", status=404, session=session,
                    what=f"job {_job_id(job_id)}")
    return page(request, "job.html", session=session, active="jobs", job=job,
                spec_yaml=views.spec_yaml(job.spec_doc or {}, viewer=session.user),
                plan=next((e.data for e in store.list_events(job.id)
                           if e.reason == Reason.PLANNED), None),
                levels=cluster_levels(store.list_nodes(), settings),
                goodput=job_goodput(job, store).to_dict())


@router.get("/jobs/{job_id}/comm.json")
def job_comm(job_id: str, session: SessionDep, store: StoreDep) -> Response:
    """The communication signature (cost model) on the job's current placement; the page
    fetches it again whenever the ranks move. Not in /v1: it is a view, not a resource."""
    job = store.get_job(_job_id(job_id), viewer=session.user)
    if job is None:
        raise NotFound(f"job {_job_id(job_id)!r} not found")
    comm = views.comm_signature(job, ranks=store.list_ranks(job.id), nodes=store.list_nodes())
    body = {"available": False} if comm is None else {"available": True, **asdict(comm)}
    return secure(JSONResponse(body))


@router.get("/cluster", response_class=HTMLResponse)
def cluster_page(request: Request, session: SessionDep, store: StoreDep,
                 settings: SettingsDep, runtime: RuntimeDep) -> Response:
    nodes = store.list_nodes()
    levels = cluster_levels(nodes, settings)
    now = _cluster_now(store, nodes, session)
    health = {s.name: views.health_cell(s) for s in node_statuses(store, settings)}
    return page(request, "cluster.html", session=session, active="cluster", levels=levels,
                tree=views.level_tree(nodes, levels), nodes=now.nodes, total=now.total,
                used=now.used, health=health, summary=now.summary,
                is_admin=session.user.is_admin,
                pool=views.warm_pool_view(runtime.pool_status() if runtime else None, nodes))


@router.get("/cluster.json")
def cluster_json(session: SessionDep, store: StoreDep, settings: SettingsDep) -> Response:
    """What the cluster page redraws every poll: nodes, who holds which GPU (as the viewer may
    see it), the totals and each node's health cell. Utilisation comes from
    /v1/cluster/usage."""
    now = _cluster_now(store, store.list_nodes(), session)
    health = {s.name: asdict(views.health_cell(s)) for s in node_statuses(store, settings)}
    return secure(JSONResponse({**asdict(now), "summary": now.summary, "health": health}))


def _cluster_now(store: Store, nodes: list[NodeRecord], session: Session) -> views.ClusterNow:
    """The nodes with the GPUs and CPUs the active jobs hold on them (as the viewer may see
    who holds them)."""
    placed = []
    for job in store.active_jobs():
        if job.current_attempt < 1:
            continue
        attempt = next((a for a in store.list_attempts(job.id)
                        if a.number == job.current_attempt), None)
        placed.append((job, attempt.placement if attempt is not None else None))
    return views.cluster_now(nodes, views.gpu_usage(gpu_holds(store), viewer=session.user),
                             views.cpu_usage(placed, viewer=session.user))


@router.get("/jobs/{job_id}/artifacts/{diagnosis_id}/{index}")
def artifact(job_id: str, diagnosis_id: Annotated[int, FastPath(ge=1, le=INT32_MAX)],
             index: Annotated[int, FastPath(ge=0, le=10_000)], user: ReaderDep,
             store: StoreDep, settings: SettingsDep) -> Response:
    """Serves a file a stored diagnosis lists, only from inside this job's own run dir, read
    without following a link (the job wrote that dir) and up to MAX_ARTIFACT_BYTES: the URL
    names an index, never a path."""
    job = store.get_job(_job_id(job_id), viewer=user)
    diagnoses = store.list_diagnoses(job.id) if job is not None else []
    found = next((d for d in diagnoses if d.id == diagnosis_id), None)
    paths = list(found.report.get("artifacts") or []) if found is not None else []
    if job is None or not 0 <= index < len(paths):
        raise NotFound("no such artifact")
    run_dir = Path(settings.resolved_runs_dir).resolve() / job.id
    name = str(paths[index])
    try:
        fd = runfiles.open_read(run_dir, Path(name) if Path(name).is_absolute()
                                else run_dir / name)
    except OSError:
        raise NotFound(f"artifact {name!r} is not available on this server") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_ARTIFACT_BYTES + 1)
    if len(data) > MAX_ARTIFACT_BYTES:
        data = data[:MAX_ARTIFACT_BYTES] + b"\n[cut at %d bytes]\n" % MAX_ARTIFACT_BYTES
    filename = quote(Path(name).name) or "artifact"
    return secure(Response(data, media_type="text/plain; charset=utf-8", headers={
        "Content-Disposition": f"attachment; filename*=utf-8''{filename}"}))


@router.get("/favicon.ico")
def favicon() -> Response:
    return secure(FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml"))


@router.get("/static/{name}")
def static(name: str) -> Response:
    path = (STATIC_DIR / name).resolve()
    if path.parent != STATIC_DIR.resolve() or not path.is_file():
        raise NotFound(f"static file {name!r} not found")
    media = STATIC_TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "text/plain"
    response = FileResponse(path, media_type=media)
    response.headers["Cache-Control"] = "no-cache"
    return secure(response)


def install(app: Any) -> None:
    """Registers the pages and the redirect to /login for signed-out browsers."""
    app.include_router(router)
    app.add_exception_handler(LoginRequired, login_redirect)
