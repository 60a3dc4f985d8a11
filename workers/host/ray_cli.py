"""Ray's command line (`ray start ...`) with meshyard's setup worker for the nodes it starts.

    python -m workers.host.ray_cli start --block --address HEAD:PORT ...

deploy/baremetal/ray-node.sh starts a host's Ray node this way: the raylet then starts its
worker processes through workers/host/setup_worker.py instead of Ray's own setup worker, which
imports Ray before the worker does (half a CPU-second of every worker actor's start). Every
argument is Ray's; `ray --help` documents them.
"""

from __future__ import annotations

from workers.host import setup_worker


def main() -> None:
    from ray.scripts.scripts import cli

    with setup_worker.installed():
        cli(prog_name="ray")


if __name__ == "__main__":
    main()
