"""AEPO's rollout metrics in verl's logger, once per training step (docs/verl.md, "Logs").

The tree's metadata travels with every leaf in verl's per-sample ``extra_fields`` (agent_loop.py,
:func:`~aepo_rl.integrations.verl.agent_loop.leaf_output`), which verl stores in TransferQueue but
never reduces. :func:`rollout_metrics` reduces them over the step's leaves; the plugin extends verl's
registered ``sync`` trainer (:func:`install`) so that its ``_compute_metrics`` adds them to the step's
metrics, next to verl's own, when the AEPO agent loops are in use.

They are per-leaf aggregates of what a leaf carries (algorithm.md §7.2 counts some quantities once per
tree instead), hence their own ``rollout/aepo/`` prefix:

- ``rollout/aepo/global_samples``: mean m of §1.3 over the step's prompts;
- ``rollout/aepo/branches_per_prompt``: forked leaves per prompt (§1.4);
- ``rollout/aepo/depth/mean``, ``/max``: forks between a leaf and its global sample;
- ``rollout/aepo/tool_calls_per_leaf``, ``rollout/aepo/tool_errors_per_leaf``: tool calls in a leaf's
  response (a call in a shared prefix counts in every leaf that holds it), and those that failed;
- ``rollout/aepo/tool_error_share``: failed calls / calls, over the leaves;
- ``rollout/aepo/finish/<reason>``: share of leaves that ended that way (answer, eos, length, …).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

PREFIX = "rollout/aepo/"


def rollout_metrics(uids: list, extra_fields: list) -> dict[str, float]:
    """The step's AEPO rollout metrics from its leaves' ``uid`` and ``extra_fields``; {} without AEPO leaves."""
    rows = [(uid, extra) for uid, extra in zip(uids, extra_fields)
            if isinstance(extra, dict) and "aepo_traj_id" in extra]
    if not rows:
        return {}
    prompts = {}
    for uid, extra in rows:
        prompts.setdefault(uid, extra)  # per-prompt values are the same on every leaf of a tree
    n = len(rows)
    calls = sum(extra["aepo_num_tool_calls"] for _, extra in rows)
    errors = sum(extra["aepo_tool_errors"] for _, extra in rows)
    depths = [extra["aepo_depth"] for _, extra in rows]
    out = {
        f"{PREFIX}global_samples": sum(e["aepo_global_samples"] for e in prompts.values()) / len(prompts),
        f"{PREFIX}branches_per_prompt": sum(e["aepo_branches"] for e in prompts.values()) / len(prompts),
        f"{PREFIX}depth/mean": sum(depths) / n,
        f"{PREFIX}depth/max": float(max(depths)),
        f"{PREFIX}tool_calls_per_leaf": calls / n,
        f"{PREFIX}tool_errors_per_leaf": errors / n,
        f"{PREFIX}tool_error_share": errors / calls if calls else 0.0,
    }
    for reason, count in Counter(extra["aepo_finish_reason"] for _, extra in rows).items():
        out[f"{PREFIX}finish/{reason}"] = count / n
    return out


def _as_list(values) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def install(trainer_sync) -> Callable[[], None]:
    """Replace verl's registered ``sync`` trainer by a subclass whose ``_compute_metrics`` adds
    :func:`rollout_metrics` when the AEPO agent loops are in use; returns the function that puts verl's
    back. The plugin runs it right after verl imports ``verl.trainer.ppo.v1.trainer_sync``. verl's
    ``register_trainer`` refuses a second class under a taken name, hence the registry entry is set here."""
    from verl.trainer.ppo.v1 import trainer_base

    base = trainer_base.TRAINER_REGISTRY["sync"]
    if base is not trainer_sync.PPOTrainerSync:
        raise RuntimeError(f"verl's 'sync' trainer is {base.__module__}.{base.__qualname__}, not verl's "
                           "PPOTrainerSync (another plugin, or a second copy of this one)")

    class AEPOMetricsSyncTrainer(base):
        """verl's sync trainer; its step metrics also hold AEPO's rollout metrics
        (aepo_rl.integrations.verl.metrics)."""

        def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
            super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
            from aepo_rl.integrations.verl.checks import uses_aepo_loops

            if not uses_aepo_loops(self.config):
                return
            import transfer_queue as tq

            keys = [key for key, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
            if keys:
                data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id,
                                       select_fields=["uid", "extra_fields"])
                metrics.update(rollout_metrics(_as_list(data["uid"]), _as_list(data["extra_fields"])))

    AEPOMetricsSyncTrainer.__qualname__ = AEPOMetricsSyncTrainer.__name__ = f"AEPOMetrics{base.__name__}"
    trainer_base.TRAINER_REGISTRY["sync"] = AEPOMetricsSyncTrainer

    def undo():
        if trainer_base.TRAINER_REGISTRY.get("sync") is AEPOMetricsSyncTrainer:
            trainer_base.TRAINER_REGISTRY["sync"] = base

    return undo
