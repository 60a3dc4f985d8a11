"""A small typed client for the meshyard REST API (what the CLI uses; import it too).

>>> from api.client import MeshyardClient                        # doctest: +SKIP
>>> with MeshyardClient("http://127.0.0.1:8470", token) as c:
...     job = c.submit("examples/quickstart.yaml", submission_id="run-1")
...     c.get_job(job.id).state
<JobState.QUEUED: 'QUEUED'>

`connect()` finds the server and token the way the CLI does: explicit arguments, then
MESHYARD_URL / MESHYARD_TOKEN, then the data dir (server.json and admin.token).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from api.schemas import (
    AttemptList,
    CheckpointList,
    Cluster,
    DiagnosisList,
    Event,
    EventList,
    Job,
    JobPage,
    JobSummary,
    LogList,
    MetricList,
    NodeHealthList,
    NodeHealthOut,
    Package,
    QuotaInfo,
    RankList,
    SubmitResult,
    TokenCreated,
    TokenInfo,
    TokenList,
    Topology,
    UserInfo,
    UserList,
)

DEFAULT_URL = "http://127.0.0.1:8470"
DEFAULT_MAX_PACKAGE_BYTES = 100 * 1024 * 1024  # the server's default cap
SERVER_FILE = "server.json"
ADMIN_TOKEN_FILE = "admin.token"
M = TypeVar("M", bound=BaseModel)
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


class MeshyardAPIError(RuntimeError):
    """A non-2xx answer; `problem` is the decoded application/problem+json body."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status, self.problem = status, problem
        detail = problem.get("detail") or problem.get("title") or "error"
        lines = [f"HTTP {status}: {detail}"]
        lines += [f"  {e.get('loc')}: {e.get('msg')}" for e in problem.get("errors") or []]
        super().__init__("\n".join(lines))

    @property
    def errors(self) -> list[dict[str, Any]]:
        return list(self.problem.get("errors") or [])


@dataclass(frozen=True)
class Connection:
    url: str
    token: str | None


def resolve_connection(*, url: str | None = None, token: str | None = None,
                       data_dir: Path | None = None,
                       env: Mapping[str, str] | None = None) -> Connection:
    """Flags win over the environment, which wins over the data dir."""
    env = os.environ if env is None else env
    data_dir = data_dir or Path(env.get("MESHYARD_DATA_DIR", ".meshyard"))
    url = url or env.get("MESHYARD_URL") or _server_url(data_dir) or DEFAULT_URL
    token = token or env.get("MESHYARD_TOKEN") or _read_text(data_dir / ADMIN_TOKEN_FILE)
    return Connection(url=url.rstrip("/"), token=token)


def _server_url(data_dir: Path) -> str | None:
    text = _read_text(data_dir / SERVER_FILE)
    if not text:
        return None
    try:
        url = json.loads(text).get("url")
    except (json.JSONDecodeError, AttributeError):
        return None
    return url if isinstance(url, str) else None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class MeshyardClient:
    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout,
                                  transport=transport)

    @classmethod
    def connect(cls, *, url: str | None = None, token: str | None = None,
                data_dir: Path | None = None, timeout: float = 30.0) -> MeshyardClient:
        conn = resolve_connection(url=url, token=token, data_dir=data_dir)
        return cls(conn.url, conn.token, timeout=timeout)

    @property
    def base_url(self) -> str:
        return str(self._http.base_url)

    def __enter__(self) -> MeshyardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, model: type[M], **kwargs: Any) -> M:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise MeshyardAPIError(response.status_code, _problem(response))
        return model.model_validate(response.json())

    # jobs ---------------------------------------------------------------------------------
    def submit(self, spec: Mapping[str, Any] | str | Path, *,
               submission_id: str | None = None) -> SubmitResult:
        """Submits a spec: a mapping, a path to a .yaml/.yml/.json file, or YAML text."""
        headers = {"Idempotency-Key": submission_id} if submission_id else {}
        if isinstance(spec, Mapping):
            return self._request("POST", "/v1/jobs", SubmitResult, json=dict(spec),
                                 headers=headers)
        text = spec.read_text() if isinstance(spec, Path) else spec
        is_json = isinstance(spec, Path) and spec.suffix == ".json"
        headers["Content-Type"] = "application/json" if is_json else "application/yaml"
        return self._request("POST", "/v1/jobs", SubmitResult, content=text.encode(),
                             headers=headers)

    def list_jobs(self, *, state: list[str] | None = None, owner: str | None = None,
                  name: str | None = None, limit: int = 50,
                  cursor: str | None = None) -> JobPage:
        params: dict[str, Any] = {"limit": limit}
        params.update({k: v for k, v in (("state", state), ("owner", owner), ("name", name),
                                         ("cursor", cursor)) if v})
        return self._request("GET", "/v1/jobs", JobPage, params=params)

    def iter_jobs(self, **filters: Any) -> Iterator[JobSummary]:
        """Every matching job, newest first, following the cursor."""
        cursor: str | None = None
        while True:
            page = self.list_jobs(cursor=cursor, **filters)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def get_job(self, job_id: str) -> Job:
        return self._request("GET", f"/v1/jobs/{job_id}", Job)

    def wait(self, job_id: str, *, states: frozenset[str] = TERMINAL, timeout_s: float = 600.0,
             poll_s: float = 0.5) -> Job:
        """Polls until the job is in one of `states` (default: finished); TimeoutError after
        `timeout_s` with the last state in the message."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get_job(job_id)
            if job.state.value in states:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"{job_id} still {job.state.value} after {timeout_s:.0f} s")
            time.sleep(poll_s)

    def cancel(self, job_id: str) -> Job:
        return self._request("POST", f"/v1/jobs/{job_id}/cancel", Job)

    def events(self, job_id: str, *, after: int = 0, limit: int = 1000) -> list[Event]:
        page = self._request("GET", f"/v1/jobs/{job_id}/events", EventList,
                             params={"after": after, "limit": limit})
        return list(page.items)

    def attempts(self, job_id: str) -> AttemptList:
        return self._request("GET", f"/v1/jobs/{job_id}/attempts", AttemptList)

    def ranks(self, job_id: str, *, attempt: int | None = None) -> RankList:
        params = {"attempt": attempt} if attempt is not None else {}
        return self._request("GET", f"/v1/jobs/{job_id}/ranks", RankList, params=params)

    def metrics(self, job_id: str, *, rank: int | None = None,
                after_step: int | None = None, limit: int = 10_000,
                keys: list[str] | None = None) -> MetricList:
        """Raw rows; each row's `values` holds the other reported metrics (`keys` only, when
        given)."""
        params: dict[str, Any] = {k: v for k, v in (("rank", rank), ("after_step", after_step))
                                  if v is not None}
        if keys is not None:
            params["keys"] = ",".join(keys)
        return self._request("GET", f"/v1/jobs/{job_id}/metrics", MetricList,
                             params={**params, "limit": limit})

    def logs(self, job_id: str, *, rank: int | None = None, after: int = 0,
             limit: int = 1000) -> LogList:
        params: dict[str, Any] = {"after": after, "limit": limit}
        if rank is not None:
            params["rank"] = rank
        return self._request("GET", f"/v1/jobs/{job_id}/logs", LogList, params=params)

    def checkpoints(self, job_id: str) -> CheckpointList:
        """The job's complete checkpoints, every attempt's."""
        return self._request("GET", f"/v1/jobs/{job_id}/checkpoints", CheckpointList)

    def diagnoses(self, job_id: str) -> DiagnosisList:
        return self._request("GET", f"/v1/jobs/{job_id}/diagnoses", DiagnosisList)

    # code packages ------------------------------------------------------------------------
    def get_package(self, sha256: str) -> Package | None:
        response = self._http.get(f"/v1/packages/{sha256}")
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise MeshyardAPIError(response.status_code, _problem(response))
        return Package.model_validate(response.json())

    def upload_package(self, data: bytes) -> Package:
        return self._request("POST", "/v1/packages", Package, content=data,
                             headers={"Content-Type": "application/zip"})

    def upload_dir(self, path: Path, *, max_bytes: int = DEFAULT_MAX_PACKAGE_BYTES) -> Package:
        """Zips a working dir (.gitignore-style excludes, api/packaging.py) and uploads it,
        unless this user uploaded the same package before."""
        from api.packaging import build_package

        local = build_package(path, max_bytes=max_bytes)
        return self.get_package(local.digest) or self.upload_package(local.data)

    def submit_with_code(self, spec: Mapping[str, Any] | str | Path, *, working_dir: Path,
                         submission_id: str | None = None) -> SubmitResult:
        """Uploads `working_dir` and submits `spec` (an entrypoint job) running it."""
        data = _spec_data(spec)
        entry = data.get("entrypoint")
        if not isinstance(entry, dict):
            raise ValueError("--working-dir ships code for an entrypoint, but the spec has no "
                             "`entrypoint` (command or function); add one")
        package = self.upload_dir(working_dir)
        data["entrypoint"] = {**entry, "working_dir": package.package}
        return self.submit(data, submission_id=submission_id)

    # tokens, users, quotas ----------------------------------------------------------------
    def create_token(self, *, user: str | None = None, role: str | None = None,
                     label: str = "") -> TokenCreated:
        body = {k: v for k, v in (("user", user), ("role", role)) if v is not None}
        return self._request("POST", "/v1/tokens", TokenCreated, json={**body, "label": label})

    def list_tokens(self, *, user: str | None = None,
                    include_revoked: bool = False) -> TokenList:
        params: dict[str, Any] = {"include_revoked": include_revoked}
        if user is not None:
            params["user"] = user
        return self._request("GET", "/v1/tokens", TokenList, params=params)

    def revoke_token(self, token_id: int) -> TokenInfo:
        return self._request("DELETE", f"/v1/tokens/{token_id}", TokenInfo)

    def list_users(self) -> UserList:
        return self._request("GET", "/v1/users", UserList)

    def set_role(self, user: str, role: str) -> UserInfo:
        return self._request("PATCH", f"/v1/users/{user}", UserInfo, json={"role": role})

    # nodes --------------------------------------------------------------------------------
    def list_nodes(self) -> NodeHealthList:
        return self._request("GET", "/v1/nodes", NodeHealthList)

    def cordon(self, node: str, *, reason: str = "", permanent: bool = False) -> NodeHealthOut:
        return self._request("POST", f"/v1/nodes/{node}/cordon", NodeHealthOut,
                             json={"reason": reason, "permanent": permanent})

    def uncordon(self, node: str, *, reason: str = "") -> NodeHealthOut:
        return self._request("POST", f"/v1/nodes/{node}/uncordon", NodeHealthOut,
                             json={"reason": reason})

    def get_quota(self, user: str) -> QuotaInfo:
        return self._request("GET", f"/v1/users/{user}/quota", QuotaInfo)

    def set_quota(self, user: str, limits: Mapping[str, float | None]) -> QuotaInfo:
        return self._request("PUT", f"/v1/users/{user}/quota", QuotaInfo, json=dict(limits))

    # cluster & ops ------------------------------------------------------------------------
    def cluster(self) -> Cluster:
        return self._request("GET", "/v1/cluster", Cluster)

    def topology(self) -> Topology:
        return self._request("GET", "/v1/cluster/topology", Topology)

    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False


def _spec_data(spec: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """A spec as a mapping: given as one, or a .yaml / .yml / .json file, or YAML text."""
    from orchestrator.admission.documents import parse_document

    if isinstance(spec, Mapping):
        return dict(spec)
    text = spec.read_text() if isinstance(spec, Path) else spec
    data = parse_document(text, yaml_body=not (isinstance(spec, Path) and spec.suffix == ".json"))
    if not isinstance(data, dict):
        raise ValueError("a job spec must be a mapping of fields")
    return data


def _problem(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {"status": response.status_code, "detail": response.text[:500]}
    return body if isinstance(body, dict) else {"detail": str(body)}
