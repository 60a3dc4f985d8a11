"""A Ray Train program whose training function raises on every rank, after each rank has
made one report (the barrier: no rank raises, and ends the job, before the others
reported)."""

import torch.distributed as dist

import meshyard.train as train
from meshyard.train import ScalingConfig
from meshyard.train.torch import TorchTrainer


def train_func(config):
    train.report({"loss": 1.0})
    dist.barrier()
    raise ValueError(f"bad learning rate {config['lr']}")


def run(storage_path=None):
    return TorchTrainer(train_func, train_loop_config={"lr": -1},
                        scaling_config=ScalingConfig(num_workers=2),
                        run_config=_run_config(storage_path)).fit()


def _run_config(storage_path):
    return train.RunConfig(name="fails", storage_path=storage_path)


if __name__ == "__main__":
    run()
