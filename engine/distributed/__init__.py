"""Several processes, one job: torch.distributed through torch's own launcher (torchrun's elastic agent).

``launch`` starts N ranks with ``torch.distributed.launcher.api.elastic_launch``; each rank runs its
entrypoint inside an initialised process group and returns a value. ``collectives`` measures the
collectives nccl-tests measures; ``ranks`` aligns rank clocks and builds the per-rank view.
"""

from __future__ import annotations

from opscope.engine.distributed.launch import LaunchSpec, init_rank, launch

__all__ = ["LaunchSpec", "init_rank", "launch"]
