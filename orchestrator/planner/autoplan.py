"""`parallelism: auto`: a JobSpec's planning request, the spec a plan resolves it to, and the
ranked table people read. Pure module.

Batch semantics: the planner keeps the global batch (sequences per optimizer step). With
`auto`, it is `parallelism.auto_global_batch`, or `training.micro_batch_size *
grad_accum_steps` per planned GPU. The resolved spec carries it back as
  pp > 1:  micro_batch_size = global / dp, pp_microbatches = m, grad_accum_steps = 1
  pp = 1:  micro_batch_size = global / (dp * ep) / m, grad_accum_steps = m
so `spec.global_batch_size` is unchanged by planning (ep ranks read distinct data, cp ranks
share theirs).

A MoE model (`model.moe`) is planned with expert-parallel degrees too; context parallel is
considered only for a job that runs on GPUs (resources.device cuda, or auto on a cluster
with free GPUs) with dropout 0, the layouts `_ep_cp_issues` in spec.py accepts.
"""

from __future__ import annotations

from typing import Any

from orchestrator.placement.links import LinkFigures
from orchestrator.planner.memory import ModelShape
from orchestrator.planner.planner import (
    Hardware,
    Plan,
    PlanningError,
    PlanRequest,
    PlanResult,
    plan,
)
from orchestrator.spec import Device, GPTModel, JobSpec, parse_spec
from orchestrator.topology.model import ClusterTopology


def hardware_for(cluster: ClusterTopology, *, base: Hardware | None = None) -> Hardware:
    """The default figures, with the GPU memory the topology reports when it has one."""
    hw = base or Hardware()
    sizes = [g.memory_gb for n in cluster.nodes for g in n.topology.gpus if g.memory_gb]
    if not sizes:
        return hw
    return Hardware(memory_gb=min(sizes), peak_tflops=hw.peak_tflops, efficiency=hw.efficiency,
                    reserve=hw.reserve, precision=hw.precision)


def free_gpus(cluster: ClusterTopology) -> int:
    return sum(len(n.free_gpus) for n in cluster.nodes)


def request_from_spec(spec: JobSpec, *, cluster: ClusterTopology,
                      hardware: Hardware | None = None) -> PlanRequest:
    if not isinstance(spec.model, GPTModel):
        raise PlanningError("parallelism: auto needs the built-in GPT model (model.kind: gpt), "
                            "whose sizes the planner can read; set the degrees by hand")
    p, t = spec.parallelism, spec.training
    gpus = p.auto_gpus or free_gpus(cluster)
    if gpus < 1:
        raise PlanningError("parallelism: auto found no free GPU in the cluster; set the "
                            "degrees by hand or wait for GPUs")
    batch = p.auto_global_batch or t.micro_batch_size * t.grad_accum_steps * gpus
    return PlanRequest(model=ModelShape.from_gpt(spec.model, name=spec.name), global_batch=batch,
                       gpus=gpus, hardware=hardware or hardware_for(cluster), even_stages=True,
                       worker_layouts=True, top_k=5, solve_top=1,
                       cp_refused=_cp_refused(spec, cluster))


def _cp_refused(spec: JobSpec, cluster: ClusterTopology) -> str | None:
    """Why the job cannot run context parallel (spec.py's checks), or None."""
    r = spec.resources
    if not (r.device == Device.CUDA or (r.device == Device.AUTO and free_gpus(cluster) > 0)):
        return ("the job does not run on GPUs (torch's context_parallel has no CPU attention "
                "strategy)")
    if isinstance(spec.model, GPTModel) and spec.model.dropout > 0:
        return f"model.dropout={spec.model.dropout} (context parallel needs dropout 0)"
    return None


def resolved_data(spec: JobSpec, best: Plan, *, global_batch: int) -> dict[str, Any]:
    """The spec's data with the plan's degrees (see module doc); parse_spec validates it."""
    c = best.config
    local = global_batch // c.data_shards
    data = spec.model_dump(mode="json")
    par: dict[str, Any] = {
        "tp": c.tp, "pp": c.pp, "dp_shard": c.dp_shard, "dp_replicate": c.dp_replicate,
        "ep": c.ep, "cp": c.cp,
        "zero_stage": c.zero_stage, "activation_checkpointing": c.activation_checkpointing,
        "sequence_parallel": c.tp > 1 and spec.model.seq_len % c.tp == 0}
    if c.pp > 1:
        par |= {"pp_microbatches": c.microbatches, "pp_schedule": c.schedule,
                "pp_virtual_stages": c.virtual_stages}
        data["training"] |= {"micro_batch_size": local, "grad_accum_steps": 1}
    else:
        data["training"] |= {"micro_batch_size": local // c.microbatches,
                             "grad_accum_steps": c.microbatches}
    data["parallelism"] = par
    data["resources"]["workers"] = None
    return data


def resolve_auto(spec: JobSpec, *, cluster: ClusterTopology, hardware: Hardware | None = None,
                 figures: LinkFigures | None = None) -> tuple[JobSpec, PlanResult | None]:
    """(spec, None) for a spec without `auto`; else (the top plan's spec, the plan result)."""
    if not spec.parallelism.auto:
        return spec, None
    req = request_from_spec(spec, cluster=cluster, hardware=hardware)
    result = plan(cluster, req, figures=figures)
    if not result.plans:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(result.rejected_counts.items()))
        why = result.no_fit.message() if result.no_fit is not None else "no configuration"
        raise PlanningError(f"parallelism: auto found no feasible plan on {req.gpus} GPUs "
                            f"({counts}): {why}")
    return parse_spec(resolved_data(spec, result.plans[0], global_batch=req.global_batch)), result


def format_table(result: PlanResult, *, limit: int = 10) -> str:
    """The ranked plans as a fixed-width table, then the rejection counts."""
    head = (f"{'#':>2} {'plan':<36} {'step s':>9} {'compute':>8} {'bubble':>6} "
            f"{'comm exp':>9} {'mem GB':>7} {'par':>5} {'grad':>5} {'opt':>6} {'act':>6}")
    lines = [f"{result.world_size} GPUs, TP domain {result.tp_domain}, {result.considered} "
             f"configurations considered, {result.feasible} feasible, planned in "
             f"{result.elapsed_s * 1e3:.0f} ms", head]
    for i, p in enumerate(result.plans[:limit], 1):
        m = p.memory
        lines.append(f"{i:>2} {p.config.label():<36} {p.step_s:>9.4g} {p.compute_s:>8.4g} "
                     f"{p.bubble:>6.1%} {p.comm_exposed_s:>9.3g} {m.total / 1e9:>7.1f} "
                     f"{m.params / 1e9:>5.1f} {m.grads / 1e9:>5.1f} {m.optimizer / 1e9:>6.1f} "
                     f"{m.activations / 1e9:>6.1f}")
    if result.rejected_counts:
        lines.append("rejected: " + ", ".join(f"{k} {v}" for k, v in
                                              sorted(result.rejected_counts.items())))
        seen: set[str] = set()
        for r in result.rejected:
            if r.reason not in seen:
                seen.add(r.reason)
                lines.append(f"  {r.reason}: {r.message}")
    for i, p in enumerate(result.plans[:limit], 1):
        if p.solver and "total_s" in p.solver:
            lines.append(f"solver check #{i}: communication {p.solver['total_s']:.4g} s/step on "
                         f"the solver's placement (level {p.solver.get('level')}) vs "
                         f"{p.comm_total_s:.4g} s on the planner's packed layout")
        elif p.solver:
            lines.append(f"solver check #{i}: {p.solver.get('error')}")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)
