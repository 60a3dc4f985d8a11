"""Hang watchdog: detection policies, evidence normalisation, analysis, reports.

Flow (the controller drives it; everything here is pure and never acts):

1. `detect.evaluate_stall(policy, now_s=..., started_s=..., ranks=[RankProgress...],
   step_times=[...])` -> StallDecision (stalled / dead / silent ranks); straggler scores from
   time-to-enter with `detect.straggler_scores` + `detect.find_stragglers`.
2. On a decision that needs diagnosis, each living rank runs
   `workers.host.evidence.collect_evidence(run_dir, rank, stamp=...)` on a side thread and returns
   a JSON-able summary; dead ranks are evidence too (`evidence_files.read_announcement`,
   exit code). `evidence_files` is the on-disk layout both sides share.
3. `inputs.RankEvidence.from_summary(summary, alive=...)` per rank ->
   `inputs.AnalysisInput(ranks=..., world_size=..., pg_members=..., pg_names=...,
   locations={rank: report.RankLocation(...)}, trigger="stall"|"straggler")`.
4. `analyze.analyze(input)` -> `report.DiagnosisReport` (to_dict / to_json / to_markdown).

In the runtime, `orchestrator.runtime.hangwatch.AttemptWatchdog` (called from the attempt
controller's loop) drives this with `monitor.HangMonitor` (stall / silent detection once per
episode, straggler probes, the spec's action); the poller stores each report.

Offline (`meshyard diagnose --fr DIR --logs DIR`): `offline.diagnose_offline(...)`.
Logs (`meshyard logs parse FILE --json`): `[e.to_dict() for e in logs.parse_text(text)]`; the
parser's parts: `log_prefixes` (launcher / shipper prefixes), `log_patterns` (NCCL lines),
`log_torch` (PyTorch and gloo messages, whole or cut), `log_blocks` and `log_elastic`
(multi-line reports, torchrun's failure summary).
"""
