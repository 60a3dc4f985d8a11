"""The parallelism planner: which tp / pp / dp / ZeRO layout, memory, calibration."""
