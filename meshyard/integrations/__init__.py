"""Framework integrations that send a framework's logged metrics and saved checkpoints to
meshyard (`meshyard.train.report`) with a one-line change; each needs its framework installed
(`pip install meshyard[lightning]` / `meshyard[hf]`):

    from meshyard.integrations.lightning import MeshyardCheckpointHook, MeshyardLogger
    trainer = lightning.Trainer(logger=MeshyardLogger(), callbacks=[MeshyardCheckpointHook()])

    from meshyard.integrations.hf import MeshyardCallback
    trainer = transformers.Trainer(..., callbacks=[MeshyardCallback()])  # logs, checkpoints
"""
