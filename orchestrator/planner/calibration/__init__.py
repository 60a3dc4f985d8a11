"""Collective calibration: nccl-tests-style figures, alpha-beta fits per link class."""
