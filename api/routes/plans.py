"""/v1/plans: the parallelism planner's ranked table; `parallelism: auto` at submit time.

POST /v1/plans {"model": "llama-70b" | {n_layers, d_model, n_heads, vocab_size, seq_len, ...},
                "global_batch": 512, "gpus": 64, "hardware": {...}, "cluster": {declared doc}}
answers {"result": {plans, rejected, ...}, "table": "<fixed-width text>"}. Without
`cluster`, the planner uses the control plane's nodes and their free GPUs (GPUs held by active
jobs, placed or being placed, are busy: `placement.holds`). Link figures come from
`<data dir>/calibration.json` when present.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.deps import SettingsDep, StoreDep, UserDep
from api.errors import Unprocessable
from api.store_views import cluster_from_store
from orchestrator.admission.documents import document_issue
from orchestrator.bounds import limits as lim
from orchestrator.planner.autoplan import format_table, hardware_for
from orchestrator.planner.calibration.figures import load_figures
from orchestrator.planner.memory import KNOWN_MODELS, ModelShape
from orchestrator.planner.planner import Hardware, PlanningError, PlanRequest, PlanResult, plan
from orchestrator.settings import Settings
from orchestrator.spec import FieldIssue
from orchestrator.store.repo import Store
from orchestrator.topology.declared import parse_cluster_doc
from orchestrator.topology.model import ClusterTopology

router = APIRouter(prefix="/v1/plans", tags=["plans"])


_BODY = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelBody(BaseModel):
    model_config = _BODY
    n_layers: int = Field(ge=1, le=lim.MAX_LAYERS, description="Transformer blocks.")
    d_model: int = Field(ge=1, le=lim.MAX_HIDDEN, description="Hidden size.")
    n_heads: int = Field(ge=1, le=1024, description="Attention heads.")
    vocab_size: int = Field(ge=1, le=lim.MAX_VOCAB, description="Vocabulary size.")
    seq_len: int = Field(ge=1, le=lim.MAX_SEQ_LEN, description="Sequence length.")
    ffn_dim: int | None = Field(default=None, ge=1, le=lim.MAX_FFN,
                                description="MLP size (default 4 d_model).")
    params: int | None = Field(default=None, ge=1, le=lim.MAX_PARAMS,
                               description="Parameter count (derived).")
    experts: int = Field(default=0, ge=0, le=256, description="MoE experts per block (0: "
                         "dense); the planner then searches expert-parallel degrees too.")
    top_k: int = Field(default=2, ge=1, le=8, description="MoE: experts per token.")
    capacity_factor: float = Field(default=1.25, gt=0, le=16, description="MoE: expert "
                                   "capacity factor.")

    @model_validator(mode="after")
    def _moe(self) -> ModelBody:
        if self.experts == 1:
            raise ValueError("experts=1 is not a mixture; use 0 (dense) or 2 or more")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} exceeds experts={self.experts}")
        return self


class HardwareBody(BaseModel):
    model_config = _BODY
    memory_gb: float | None = Field(default=None, gt=0, le=100_000, description="GPU memory "
                                    "(default: what the topology reports, else 80).")
    peak_tflops: float = Field(default=989.0, gt=0, le=1e6,
                               description="Dense peak TFLOP/s per GPU.")
    efficiency: float = Field(default=0.4, gt=0, le=1, description="Model FLOPs utilisation.")
    precision: str = Field(default="bf16-mixed", pattern="^(bf16-mixed|fp32)$")


class PlanBody(BaseModel):
    model_config = _BODY
    model: Annotated[str, Field(max_length=100)] | ModelBody = Field(
        description=f"A known model {sorted(KNOWN_MODELS)} or sizes.")
    global_batch: int = Field(ge=1, le=lim.MAX_BATCH, description="Sequences per optimizer "
                              "step.")
    gpus: int | None = Field(default=None, ge=1, le=lim.MAX_WORLD_SIZE,
                             description="GPUs to use (default: all free).")
    hardware: HardwareBody = Field(default_factory=HardwareBody)
    cluster: dict[str, Any] | None = Field(default=None, description="A declared cluster "
                                           "document (what-if), topology inline (`topo_m` "
                                           "text, never a file); default: the live cluster.")
    top_k: int = Field(default=10, ge=1, le=1000)
    even_stages: bool = Field(default=False, description="pp must divide n_layers.")
    solve_top: int = Field(default=1, ge=0, le=10, description="Run the placement solver on "
                           "this many of the best plans and report its estimate too.")


class PlanResponse(BaseModel):
    result: dict[str, Any]
    table: str


def model_shape(value: str | ModelBody | dict[str, Any]) -> ModelShape:
    if isinstance(value, str):
        if value not in KNOWN_MODELS:
            raise ValueError(f"unknown model {value!r}; use one of {sorted(KNOWN_MODELS)} or "
                             "give its sizes")
        return KNOWN_MODELS[value]
    data = value.model_dump() if isinstance(value, ModelBody) else dict(value)
    return ModelShape(name="model", **data)


def _fail(loc: str, exc: Exception) -> Unprocessable:
    return Unprocessable([FieldIssue(loc, str(exc), "value_error")])


def request_cluster(doc: dict[str, Any]) -> ClusterTopology:
    """A what-if cluster from a request body: inline topology only, bounded in size."""
    nodes = doc.get("nodes")
    if isinstance(nodes, list) and len(nodes) > lim.MAX_CLUSTER_NODES:
        raise _fail("cluster.nodes", ValueError(
            f"{len(nodes)} nodes; a plan request describes at most {lim.MAX_CLUSTER_NODES}"))
    issue = document_issue(doc)
    if issue is not None:
        raise Unprocessable([replace(issue, loc=f"cluster.{issue.loc}")])
    try:
        cluster = parse_cluster_doc(doc)  # no base_dir: topo_m_file is refused, never opened
    except ValueError as exc:
        raise _fail("cluster", exc) from None
    total = sum(len(n.topology.gpus) for n in cluster.nodes)
    if total > lim.MAX_CLUSTER_GPUS:
        raise _fail("cluster.nodes", ValueError(
            f"{total} GPUs; a plan request describes at most {lim.MAX_CLUSTER_GPUS}"))
    return cluster


def run_plan(body: PlanBody, *, store: Store, settings: Settings) -> PlanResult:
    try:
        shape = model_shape(body.model)
    except (TypeError, ValueError) as exc:
        raise _fail("model", exc) from None
    if body.cluster is not None:
        cluster = request_cluster(body.cluster)
    else:
        try:
            cluster = cluster_from_store(store, settings)
        except ValueError as exc:
            raise _fail("cluster", exc) from None
    hw = body.hardware
    base = hardware_for(cluster, base=Hardware(peak_tflops=hw.peak_tflops,
                                               efficiency=hw.efficiency, precision=hw.precision))
    if hw.memory_gb is not None:
        base = Hardware(memory_gb=hw.memory_gb, peak_tflops=hw.peak_tflops,
                        efficiency=hw.efficiency, precision=hw.precision)
    req = PlanRequest(model=shape, global_batch=body.global_batch, gpus=body.gpus, hardware=base,
                      top_k=body.top_k, even_stages=body.even_stages,
                      solve_top=body.solve_top)
    try:
        return plan(cluster, req, figures=load_figures(settings.data_dir))
    except PlanningError as exc:
        raise _fail("gpus", exc) from None


@router.post("", operation_id="createPlan", response_model=PlanResponse)
def create_plan(body: PlanBody, user: UserDep, store: StoreDep,
                settings: SettingsDep) -> PlanResponse:
    result = run_plan(body, store=store, settings=settings)
    if result.no_fit is not None:  # nothing feasible: say what would fit, not "0 feasible"
        raise Unprocessable([FieldIssue("gpus", result.no_fit.message(), "no_feasible_plan")],
                            extensions={"no_fit": result.no_fit.as_dict()})
    return PlanResponse(result=result.as_dict(), table=format_table(result))
