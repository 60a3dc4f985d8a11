"""The runtime: the control plane's Ray glue, the only package under orchestrator/ that
imports ray (its pure parts -- events, policy, failures -- import no framework).

    service.py        Runtime: connect Ray, register nodes, lead, run scheduler + poller loops
    nodes.py          Ray's live nodes and their topology (declared file, else discovery)
    scheduler.py      queued job -> gang plan -> placement group + the attempt's controller
    controller.py     one detached actor per attempt: placement wait, workers, event log
    gang.py           the attempt's worker actors: create, rank, launch, poll, stop
    hangwatch.py      the attempt's hang watchdog: evidence rounds, reports, actions
    node_evidence.py  nvidia-smi -q and Xid lines on each node of a diagnosis round
    checkpoint_uploads.py  checkpoints to and from the object store, host by host
    link_probe.py     which host's link is slow, measured from the controller's node
    poller.py         controllers' events -> the store; applies the restart policy
    pool.py           warm worker actors reused across CPU jobs
    calibrate.py      `meshyard calibrate` as a Ray job
    events.py         the typed protocol between scheduler, controller and poller; Ray names
    policy.py         restart and avoid decisions
    failures.py       grouping of rank failures

    scheduler --AttemptConfig(JobSpec, Bundles)--> controller --RankAssignment--> WorkerActor
    controller --PollReply(ControllerEvent(payload)...)--> poller --> store
"""
