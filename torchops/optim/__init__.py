"""Synchronous-replica training (TF's `SyncReplicasOptimizer`) on torchops' ConditionalAccumulator.

* `SyncReplicasOptimizer`, `train_sync_replicas` (worker threads or spawned worker processes on this machine):
  `torchops.optim.sync_replicas`.
* `run_sync_replicas` (a job launched by torchrun across machines: rank 0 the parameter server and chief,
  the other ranks workers; tolerant of stragglers, lost and restarted workers; resumable from checkpoints):
  `torchops.optim.cluster`.

See docs/accumulator.md.
"""
from .cluster import run_sync_replicas
from .sync_replicas import SyncReplicasOptimizer, SyncReplicasResult, train_sync_replicas

__all__ = ["SyncReplicasOptimizer", "SyncReplicasResult", "run_sync_replicas", "train_sync_replicas"]
