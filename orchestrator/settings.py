"""Settings: one cached `get_settings()` (pydantic-settings, env prefix MESHYARD_).

List settings read from the environment as comma-separated values
(`MESHYARD_ALLOWED_HOSTS=meshyard.example.com,10.0.0.5`) or as JSON lists.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from orchestrator.admission.access import Policy, Role
from orchestrator.admission.quotas import Quota
from orchestrator.isolation.modes import IsolationMode, JobConfinement
from orchestrator.isolation.runfiles import checkpoint_place
from orchestrator.nodes.health_policy import HealthPolicy
from orchestrator.storage.object_storage import ObjectStorage, StorageError

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# Warm pool defaults (per node): the demo job's world size on the embedded Ray; a
# small number per node on a shared Ray cluster, where every node pays the memory.
EMBEDDED_WARM_POOL = 2
CLUSTER_WARM_POOL = 1
CommaList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MESHYARD_", extra="ignore")

    data_dir: Path = Field(default=Path(".meshyard"), description="State, logs, run dirs.")
    runs_dir: Path | None = Field(
        default=None, description="Where jobs' run dirs (logs, evidence, and checkpoints "
        "without checkpoint_storage) go; default <data dir>/runs. Outside the data dir when "
        "jobs run as another OS user.")
    checkpoint_storage: Path | None = Field(
        default=None, description="A directory every host of the Ray cluster mounts at this "
        "path (NFS, a parallel filesystem): each job's checkpoints go to <it>/<job id>/, where "
        "a restart on other hosts finds them. Unset: under each job's run dir, on the disk of "
        "the host a rank runs on; a job whose ranks land on more than one host then does not "
        "start while it keeps checkpoints.")
    checkpoint_uri: str | None = Field(
        default=None, max_length=1024, description="Object storage for checkpoints, "
        "s3://BUCKET[/PREFIX] on an S3-compatible store (orchestrator/runtime/"
        "object_storage.py): each job's go to <it>/<job id>/step_<N>/, uploaded from the hosts "
        "by meshyard's own processes; the job's ranks never see the store or its keys. "
        "Exclusive with checkpoint_storage.")
    s3_endpoint: str | None = Field(
        default=None, max_length=512, description="The store's address, http(s)://HOST[:PORT] "
        "(MinIO, Ceph, a cloud's S3 endpoint); unset: AWS's own.")
    s3_region: str = Field(default="us-east-1", max_length=64)
    s3_access_key: SecretStr | None = Field(
        default=None, description="The store's key; unset: AWS_ACCESS_KEY_ID of the server's "
        "environment, else AWS's credential chain on each host.")
    s3_secret_key: SecretStr | None = Field(
        default=None, description="Its secret; unset: AWS_SECRET_ACCESS_KEY of the server's "
        "environment.")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default sqlite:///<data_dir>/meshyard.db"
    )
    host: str = "127.0.0.1"
    port: int = 8470
    admin_token: str | None = Field(default=None, description="Seeds a known admin token.")
    allow_fault_injection: bool = Field(
        default=False, description="Accept the inject_fault block in job specs (tests, demos)."
    )
    ray_address: str | None = Field(default=None, description="Existing Ray cluster; else local.")
    cluster_file: Path | None = Field(default=None, description="Declared topology YAML.")
    scheduler_enabled: bool = Field(default=True, description="Run the scheduler loop.")
    max_body_bytes: int = 1024 * 1024
    warm_pool: int | None = Field(
        default=None, ge=0, le=64,
        description="Pre-started worker actors per node, reused across jobs (0 = off). "
        f"Default: {EMBEDDED_WARM_POOL} on the embedded Ray (the demo job's two ranks), "
        f"{CLUSTER_WARM_POOL} per node on a Ray cluster (--ray-address).",
    )
    warm_pool_user_code: bool = Field(
        default=True, description="Each pooled worker also keeps a prestarted rank process "
        "(torch imported; about half the pool's idle memory) so script and function jobs "
        "start warm too; off: only jobs of the built-in loop do.")
    fork_workers: bool = Field(
        default=True, description="Worker actors forked from a fork server on each node that "
        "imported torch once (workers/host/forkserver.py): about 2 CPU-seconds less per worker "
        "started. Ray then runs meshyard's Python and workers/host/forkserver_client.py at "
        "the control plane's paths on every node; off: Ray starts each worker's process.")
    spare_controllers: int = Field(
        default=1, ge=0, le=16,
        description="Attempt controllers started ahead of the jobs that will need them (a new "
        "controller is a new Ray worker process: about half a second before the workers "
        "start); 0 = start one per attempt.")
    confine_workers: bool = Field(
        default=True, description="Trusted mode: start the embedded Ray confined (Landlock) "
        "out of the data dir, except the run dirs and data roots (in isolated mode each rank "
        "of user code is confined instead, the data dir hidden from it).")
    usage_interval_s: float = Field(
        default=10.0, ge=1, le=3600,
        description="One utilisation sample per rank this often at most (a job of more than "
        "50 ranks samples less often: at most 5 rows a second per job).")
    preemption: bool = Field(
        default=True, description="A queued job of higher priority that does not fit may "
        "stop lower-priority preemptible jobs (they checkpoint and are requeued).")
    preempt_min_run_s: float = Field(
        default=600.0, ge=0, le=7 * 86400,
        description="An attempt runs at least this long before it may be preempted (no "
        "thrash: a job just resumed is not stopped again at once).")
    node_usage_interval_s: float = Field(
        default=30.0, ge=0, le=3600,
        description="Sample every node's CPU, memory and GPUs this often (0 = off).")
    node_cordon_s: float = Field(
        default=3600.0, gt=0, le=30 * 86400,
        description="A cordon from evidence (diagnosis, device error, pre-flight) lasts this "
        "long unless an admin makes it permanent.")
    node_suspect_window_s: float = Field(
        default=1800.0, gt=0, le=30 * 86400,
        description="Suspicion (a straggler, a first timeout) counts this long.")
    node_suspect_jobs_to_cordon: int = Field(
        default=3, ge=1, le=1000,
        description="Suspicion from this many distinct jobs within the window cordons a node.")
    usage_retention_s: float = Field(
        default=86400.0, gt=0, le=90 * 86400,
        description="Node utilisation samples are kept this long.")

    # -- tenant isolation (orchestrator/isolation/modes.py) -------------------------------------
    isolation: IsolationMode = Field(
        default=IsolationMode.ISOLATED,
        description="isolated: every rank of user code is confined to its own job (no Ray, "
        "no control plane, no other job, no capabilities); a host that cannot enforce it "
        "refuses non-admin users' code. trusted: nothing is confined and any user's code can "
        "act as admin (single-team clusters only).")
    hide_paths: CommaList = Field(
        default=[], description="More host paths no job's rank may see (isolated mode): a "
        "directory is covered by an empty one, a file by /dev/null.")
    ray_worker_ports: str = Field(
        default="10002-19999", pattern=r"^\d{4,5}-\d{4,5}$",
        description="The port range of the embedded Ray's worker processes (LOW-HIGH), which "
        "every job's ranks are kept out of; a Ray cluster (--ray-address) must be started "
        "with one too (ray start --min-worker-port/--max-worker-port).")

    # -- deployment policy: which code and data a job may use ------------------------------
    code_roles: CommaList = Field(
        default=["admin", "user"],
        description="Roles whose jobs may run imported code (model.kind: import).")
    allowed_import_prefixes: CommaList = Field(
        default=[], description="Module prefixes model.path may import from; empty: any.")
    data_roots: CommaList = Field(
        default=[], description="Directories data.path must lie under; empty: "
        "<data dir>/datasets.")
    working_dir_roots: CommaList = Field(
        default=[], description="Directories an entrypoint's working_dir path may lie under "
        "(uploaded packages need none); empty: <data dir>/code.")
    max_package_bytes: int = Field(
        default=100 * 1024 * 1024, ge=1024, le=1024**3,
        description="Largest uploaded code package (zip), bytes.")

    # -- quotas for non-admin users without their own (`meshyard quota set`) ---------------
    default_max_queued_jobs: int | None = Field(default=100, ge=0)
    default_max_running_gpus: int | None = Field(default=None, ge=0)
    default_max_running_cpus: float | None = Field(default=None, ge=0)
    default_max_priority: int = Field(default=0, ge=-1000, le=1000)

    # -- HTTP: sessions, streams, hosts, proxies --------------------------------------------
    session_ttl_s: float = Field(default=12 * 3600, gt=0, le=30 * 86400,
                                 description="Dashboard sessions end this long after login.")
    max_streams_per_user: int = Field(default=8, ge=1, le=1000,
                                      description="Concurrent log follows per user.")
    allowed_hosts: CommaList = Field(
        default=[], description="Host header values the API answers besides the loopback "
        "names (DNS rebinding); '*' answers any.")
    trusted_proxies: CommaList = Field(
        default=["127.0.0.1"], description="Proxies whose X-Forwarded-Proto/For are believed "
        "(TLS termination: the session cookie is then Secure).")
    api_docs: bool = Field(default=False, description="Serve /docs and /redoc (the "
                           "OpenAPI schema at /openapi.json is always served).")

    # -- request side of tenant isolation: failed logins, /metrics -------------------------
    login_failures_max: int = Field(
        default=10, ge=1, le=100_000,
        description="Failed logins (bad bearer token, bad dashboard login) one client address "
        "may make within login_failures_window_s; then 429 with Retry-After.")
    login_failures_window_s: float = Field(
        default=60.0, gt=0, le=86400, description="The window failed logins are counted in.")
    login_throttle_clients: int = Field(
        default=10_000, ge=1, le=10_000_000,
        description="Client addresses whose failed logins are remembered (least recently "
        "failed forgotten first).")
    metrics_anonymous: Literal["cluster", "off"] = Field(
        default="cluster",
        description="What /metrics shows a scrape without a token: cluster: the cluster-level "
        "series only (no job, user or rank); off: nothing (401). With a token, also the "
        "series of the jobs that token may read.")

    @field_validator("code_roles", "allowed_import_prefixes", "data_roots", "working_dir_roots",
                     "allowed_hosts", "hide_paths",
                     "trusted_proxies", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("code_roles")
    @classmethod
    def _roles(cls, value: list[str]) -> list[str]:
        unknown = [r for r in value if r not in {x.value for x in Role}]
        if unknown:
            raise ValueError(f"unknown role(s) {unknown}; roles are admin, user, viewer")
        return value

    def health_policy(self) -> HealthPolicy:
        return HealthPolicy(cordon_s=self.node_cordon_s,
                            suspect_window_s=self.node_suspect_window_s,
                            suspect_jobs_to_cordon=self.node_suspect_jobs_to_cordon)

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'meshyard.db').resolve()}"

    @property
    def resolved_warm_pool(self) -> int:
        """Warm worker actors per node (orchestrator/runtime/pool.py)."""
        if self.warm_pool is not None:
            return self.warm_pool
        return CLUSTER_WARM_POOL if self.ray_address else EMBEDDED_WARM_POOL

    def object_storage(self) -> ObjectStorage | None:
        """The checkpoint store (`checkpoint_uri`) with its endpoint and keys; None without
        one. StorageError for a URI that is not one, or both checkpoint settings at once."""
        if not self.checkpoint_uri:
            return None
        if self.checkpoint_storage is not None:
            raise StorageError("MESHYARD_CHECKPOINT_URI and MESHYARD_CHECKPOINT_STORAGE are both "
                               "set: give checkpoints one home (unset one of them)")
        key = (self.s3_access_key.get_secret_value() if self.s3_access_key
               else os.environ.get("AWS_ACCESS_KEY_ID"))
        secret = (self.s3_secret_key.get_secret_value() if self.s3_secret_key
                  else os.environ.get("AWS_SECRET_ACCESS_KEY"))
        return ObjectStorage.parse(self.checkpoint_uri, endpoint=self.s3_endpoint,
                                   region=self.s3_region, access_key=key, secret_key=secret)

    @property
    def resolved_runs_dir(self) -> Path:
        return self.runs_dir or self.data_dir / "runs"

    def checkpoint_place(self, job_id: str) -> tuple[Path, Path]:
        """Where job `job_id` keeps its checkpoints (one folder per step): `checkpoint_place`."""
        return checkpoint_place(job_id, runs_dir=Path(self.resolved_runs_dir).resolve(),
                                storage=self.checkpoint_storage)

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def packages_dir(self) -> Path:
        return self.data_dir / "packages"

    def policy(self) -> Policy:
        roots = self.data_roots or [str(self.datasets_dir)]
        code = self.working_dir_roots or [str(self.data_dir / "code")]
        return Policy(code_roles=frozenset(Role(r) for r in self.code_roles),
                      import_prefixes=tuple(self.allowed_import_prefixes),
                      data_roots=tuple(str(Path(r).resolve()) for r in roots),
                      working_dir_roots=tuple(str(Path(r).resolve()) for r in code),
                      isolated=self.isolation is IsolationMode.ISOLATED)

    @property
    def worker_port_range(self) -> tuple[int, int]:
        lo, _, hi = self.ray_worker_ports.partition("-")
        low, high = int(lo), int(hi)
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"MESHYARD_RAY_WORKER_PORTS={self.ray_worker_ports!r}: give "
                             "LOW-HIGH with 1024 <= LOW <= HIGH <= 65535")
        return low, high

    def job_confinement(self, *, api_port: int | None = None) -> JobConfinement:
        """What every rank of user code is confined to, from the control plane's side: its
        data dir, runs dir and package store hidden (the data roots and working-dir roots
        readable), its API port (`api_port`: the one it listens on) and a local database
        closed (orchestrator/isolation/modes.py)."""
        data = self.data_dir.resolve()
        hide = [data, Path(self.resolved_runs_dir).resolve(), self.packages_dir.resolve(),
                *([self.checkpoint_storage.resolve()] if self.checkpoint_storage else []),
                *(Path(p).resolve() for p in self.hide_paths)]
        listening = self.port if api_port is None else api_port
        ports = {listening} if listening > 0 else set()
        db = local_database(self.resolved_database_url)
        if db is not None:
            ports |= set(db[0])
            hide += [Path(p) for p in db[1]]
        policy = self.policy()
        return JobConfinement(
            mode=self.isolation, hide=tuple(str(p) for p in dict.fromkeys(hide)),
            denied_ports=tuple(sorted(ports)),
            read_only=tuple(dict.fromkeys([*policy.data_roots, *policy.working_dir_roots])))

    def quota_defaults(self) -> Quota:
        return Quota(max_queued_jobs=self.default_max_queued_jobs,
                     max_running_gpus=self.default_max_running_gpus,
                     max_running_cpus=self.default_max_running_cpus,
                     max_priority=self.default_max_priority)

    def host_allowed(self, host: str) -> bool:
        """`host` is the Host header's name (no port). Loopback names always pass."""
        name = host.strip("[]").lower()
        return name in LOOPBACK_HOSTS or "*" in self.allowed_hosts or \
            name in (h.strip("[]").lower() for h in self.allowed_hosts) or \
            (self.host not in ("0.0.0.0", "::", "") and name == self.host.strip("[]").lower())


_PG_SOCKET_DIRS = ("/run/postgresql", "/var/run/postgresql")


def local_database(url: str) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """(ports, socket dirs) of a database server on this host that a job must not reach
    (None: SQLite, or a server elsewhere, which its own credentials guard).

    >>> local_database("postgresql+psycopg://u@127.0.0.1:5433/m")
    ((5433,), ('/run/postgresql', '/var/run/postgresql'))
    """
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - an unparsable URL fails elsewhere, with its reason
        return None
    if not parsed.drivername.startswith("postgresql"):
        return None
    host = parsed.host or str(parsed.query.get("host") or "")
    if host and not host.startswith("/") and host not in LOOPBACK_HOSTS:
        return None
    sockets = tuple(dict.fromkeys([*([host] if host.startswith("/") else []),
                                   *_PG_SOCKET_DIRS]))
    return (parsed.port or 5432,), sockets


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
