"""Two AEPO steps of verl 0.9.1's own trainer, ``python -m verl.trainer.main_ppo``, on the CPU.

The command is examples/verl/smoke_1gpu.sh's (the plugin's loss, the ``aepo_tree`` agent loop, GRPO,
``aepo verl-data`` rows of the synthetic task, its search tool) with a tiny random Qwen3 saved to
disk, one rank, and the CPU settings of docs/verl.md ("End to end on the CPU"), with verl's Rollout
Correction on (token IS weights and k3 rejection, decoupled). Everything verl runs
is verl's: Hydra config and validation, Ray, the TaskRunner, TransferQueue, the V1 sync trainer, the
FSDP2 engine and its training step, the agent-loop worker, the reward worker, the weight sync. What
the test harness (tests/verl_cpu/aepo_verl_cpu.py) adds through verl's plugin hooks: a CPU platform,
one gloo process group, and an HF-backed rollout server (aepo-rl's HFEngine, with a fixed logit bias
that makes the random model write tool calls) in place of vLLM, which cannot be installed next to
verl 0.9.1 here.

Marked ``verl`` and ``slow``; runs in .venv-verl (.ci/run).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.verl, pytest.mark.slow]
pytest.importorskip("verl", reason="verl is not installed here: the verl tests run in .venv-verl "
                            "(.ci/run, docs/verl.md)")

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "verl_cpu"
N = 4

CPU_OVERRIDES = [
    "trainer.device=cpu",
    "+ray_kwargs.ray_init.num_gpus=1",  # the CPU platform's Ray resource is a (fake) GPU
    "ray_kwargs.ray_init.num_cpus=8",
    "actor_rollout_ref.rollout.name=hf_cpu",
    "actor_rollout_ref.rollout.free_cache_engine=false",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "actor_rollout_ref.model.use_remove_padding=false",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.actor.use_torch_compile=false",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "data.dataloader_num_workers=0",
]
"""What the CPU needs on top of the plugin's overrides (docs/verl.md)."""

ROLLOUT_CORRECTION = ["algorithm.rollout_correction.rollout_is=token",
                      "algorithm.rollout_correction.rollout_is_threshold=2.0",
                      "algorithm.rollout_correction.rollout_rs=token_k3",
                      "algorithm.rollout_correction.rollout_rs_threshold=1.0"]
"""verl's own Rollout Correction, decoupled: truncated token IS weights on the aepo loss and k3 token rejection
(docs/algorithm.md §2.11); its rollout log-probs are the agent loop's."""


def tiny_checkpoint(path: Path) -> Path:
    """A tiny random Qwen3 and its tokenizer, saved the way verl loads a model. The chat template's
    generation prompt closes a think block, so the (steered) model opens a search at once."""
    from helpers import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = tok.chat_template.replace("<|im_start|>assistant\n{% endif %}",
                                                  "<|im_start|>assistant\n<think>go</think>{% endif %}")
    model = build_tiny_model(tok)
    model.config.max_position_embeddings = 2048
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def command(model: Path, data: Path, out: Path) -> list[str]:
    reward = HARNESS / "aepo_verl_cpu.py"  # the plugin's compute_score + a length term (see there)
    env = {"VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda", "VERL_USE_EXTERNAL_MODULES": "aepo_verl_cpu",
           "AEPO_E2E_DIR": str(out),
           "AEPO_E2E_STEER": "1", "PYTHONPATH": f"{HARNESS}{os.pathsep}{ROOT}{os.pathsep}{ROOT / 'tests'}",
           "VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl"), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    return [
        sys.executable, "-m", "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false", "critic.enable=false",
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'val.parquet'}",
        "data.train_batch_size=2", "data.max_prompt_length=512", "data.max_response_length=96",
        f"reward.custom_reward_function.path={reward}", "reward.custom_reward_function.name=compute_score",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.policy_loss.loss_mode=aepo",
        "actor_rollout_ref.actor.policy_loss._target_=aepo_rl.integrations.verl.loss.AEPOPolicyLossConfig",
        "+actor_rollout_ref.actor.policy_loss.entropy_adv_coef=0.2",
        "actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.2",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.calculate_entropy=true",
        "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.use_kl_loss=false",
        f"actor_rollout_ref.rollout.n={N}", "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        *ROLLOUT_CORRECTION,
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.agent.default_agent_loop=aepo_tree",
        "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=aepo_verl_cpu.SpyAgentLoopManager",
        "+actor_rollout_ref.rollout.custom.aepo.global_samples=2",
        "+actor_rollout_ref.rollout.custom.aepo.branch_threshold=0.3",
        "+actor_rollout_ref.rollout.custom.aepo.call_limit=3",
        "+actor_rollout_ref.rollout.custom.aepo.max_tokens_per_round=16",
        "+actor_rollout_ref.rollout.custom.aepo.max_tool_response_tokens=24",
        "+actor_rollout_ref.rollout.custom.aepo.tools=[search]",
        "+actor_rollout_ref.rollout.custom.aepo.task.name=synthetic",
        "+actor_rollout_ref.rollout.custom.aepo.task.num_train=8",
        "+actor_rollout_ref.rollout.custom.aepo.task.num_dev=4",
        "+actor_rollout_ref.rollout.custom.aepo.task.num_test=4",
        "trainer.nnodes=1", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
        "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_freq=2", f"trainer.default_local_dir={out / 'checkpoints'}",
        "trainer.logger=[console,file]", "trainer.project_name=aepo_e2e", "trainer.experiment_name=cpu",
        *CPU_OVERRIDES,
        *(f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}='{v}'" for k, v in env.items()),  # quoted: strings
    ], env


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("verl_e2e")
    model, data, out = tiny_checkpoint(base / "model"), base / "data", base / "out"
    out.mkdir()
    subprocess.run([sys.executable, "-m", "aepo_rl", "verl-data", "--task", "synthetic", "--out", str(data),
                    "task.num_train=8", "task.num_dev=4", "task.num_test=4"], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    argv, env = command(model, data, out)
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=base, env={**os.environ, **env}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1500)
    seconds = time.monotonic() - t0
    (out / "main_ppo.log").write_text(proc.stdout)
    assert proc.returncode == 0, f"main_ppo failed ({proc.returncode}); last lines:\n{proc.stdout[-6000:]}"
    print(f"main_ppo: 2 steps in {seconds:.0f} s; log {out / 'main_ppo.log'}")
    read = lambda name: [json.loads(line) for line in (out / name).read_text().splitlines()]  # noqa: E731
    for row in read("metrics.jsonl"):  # what docs/verl.md quotes
        print(row["step"], {k: round(v, 4) for k, v in row["data"].items() if k.startswith("rollout/aepo/") or k in (
            "actor/pg_loss", "actor/grad_norm", "actor/entropy_adv_scale/mean", "critic/score/mean", "timing_s/step")})
    return {"metrics": read("metrics.jsonl"), "trajectories": read("trajectories.jsonl"),
            "weights": read("weights.jsonl"), "tokenizer": model, "out": out, "data": data}


def test_two_steps_log_the_aepo_loss(run):
    steps = [row for row in run["metrics"] if "actor/pg_loss" in row.get("data", row)]
    assert [row["step"] for row in steps] == [1, 2]
    for row in steps:
        data = row["data"]
        for key in ("actor/pg_loss", "actor/entropy_adv_scale/mean", "actor/grad_preserved_frac",
                    "actor/pg_clipfrac_upper_bound", "actor/entropy"):
            assert key in data and math.isfinite(data[key]), (key, data)
        assert 0 < data["actor/entropy_adv_scale/mean"] < 2
        assert data["actor/grad_norm"] > 0, "zero gradient: no reward differences within a group"


def test_verls_rollout_correction_runs_with_the_aepo_loss(run):
    """verl computed IS weights and the rejection mask from the agent loop's rollout log-probs against its own
    recomputed π_old, and the aepo loss trained with them: its metrics are in every step."""
    for row in [row for row in run["metrics"] if "actor/pg_loss" in row["data"]]:
        data = row["data"]
        for key in ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size", "rollout_corr/k3_kl",
                    "rollout_corr/kl", "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/chi2_token"):
            assert key in data and math.isfinite(data[key]), (key, sorted(k for k in data if "rollout_corr" in k))
        assert 0 < data["rollout_corr/rollout_is_mean"] <= 2
        assert 0 <= data["rollout_corr/rollout_rs_masked_fraction"] < 1
        assert data["rollout_corr/k3_kl"] >= 0


def test_each_step_logs_aepos_rollout_metrics(run):
    """The plugin's extension of verl's sync trainer reduces the leaves' extra_fields into the step's metrics;
    they agree with what the spy saw of that step's trees."""
    train = [t for t in run["trajectories"] if not t["validate"]]
    steps = [row for row in run["metrics"] if "actor/pg_loss" in row["data"]]
    for row in steps:
        data, leaves = row["data"], [t["extra_fields"] for t in train if t["global_steps"] == row["step"]]
        assert len(leaves) == 2 * N
        assert data["rollout/aepo/global_samples"] == 2
        assert data["rollout/aepo/tool_calls_per_leaf"] == sum(e["aepo_num_tool_calls"] for e in leaves) / len(leaves)
        assert data["rollout/aepo/branches_per_prompt"] == sum(e["aepo_parent_id"] >= 0 for e in leaves) / 2
        assert sum(v for k, v in data.items() if k.startswith("rollout/aepo/finish/")) == pytest.approx(1)


def test_the_batch_holds_trees_with_masked_tool_results(run):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run["tokenizer"])
    train = [t for t in run["trajectories"] if not t["validate"]]
    by_prompt: dict = {}
    for t in train:
        by_prompt.setdefault((t["uid"], t["global_steps"]), []).append(t)
    assert len(by_prompt) == 4 and all(len(leaves) == N for leaves in by_prompt.values())  # 2 prompts x 2 steps
    forks = calls = 0
    for leaves in by_prompt.values():
        assert sorted(t["extra_fields"]["aepo_traj_id"] for t in leaves) == list(range(N))
        for t in leaves:
            extra = t["extra_fields"]
            forks += extra["aepo_parent_id"] >= 0
            calls += extra["aepo_num_tool_calls"]
            # mask 0 exactly on the <result> blocks the search tool wrote
            # (the last block may be cut by the response budget: then its closing tag is missing)
            text_masked = tok.decode([i for i, m in zip(t["response_ids"], t["response_mask"]) if m == 0])
            assert text_masked.count("<result>") == extra["aepo_num_tool_calls"]
            assert text_masked.count("</result>") in (extra["aepo_num_tool_calls"], extra["aepo_num_tool_calls"] - 1)
            model_text = tok.decode([i for i, m in zip(t["response_ids"], t["response_mask"]) if m == 1])
            assert "<result>" not in model_text
    assert calls > 0 and forks > 0, (calls, forks)


def test_weights_reach_the_rollout_after_each_step(run):
    """The rollout server gets the trainer's weights at start (step 0) and after each step; they moved
    by more than AdamW's weight decay alone would move them (lr·wd·|w| <= 1e-5 here)."""
    updates = run["weights"]
    assert [u["global_steps"] for u in updates] == [0, 1, 2]
    assert updates[0]["max_abs_change"] == 0
    assert updates[1]["max_abs_change"] > 1e-4 and updates[2]["max_abs_change"] > updates[1]["max_abs_change"]


def test_the_checkpoint_merges_into_a_model_aepo_eval_reads(run):
    """trainer.save_freq wrote verl's FSDP checkpoint of step 2; verl's model merger turns it into a Hugging
    Face folder (in bf16, verl's default) holding the weights the rollout server got after step 2, which
    aepo eval evaluates."""
    import torch
    from transformers import AutoModelForCausalLM

    actor = run["out"] / "checkpoints" / "global_step_2" / "actor"
    merged = run["out"] / "merged"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor),
                    "--target_dir", str(merged)], check=True, env=env, timeout=600)
    trained = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).state_dict()
    served = torch.load(run["out"] / "rollout_weights.pt")
    assert len(trained) >= 20 and set(trained) <= set(served)
    for name, tensor in trained.items():
        assert torch.equal(tensor, served[name].to(torch.bfloat16).float()), name
    result = run["out"] / "eval.json"
    subprocess.run([sys.executable, "-m", "aepo_rl", "eval", "--model", str(merged), "--task", "synthetic",
                    "--samples", "1", "--out", str(result), "task.num_train=8", "task.num_dev=4", "task.num_test=4",
                    "rollout.max_response_length=32"], check=True, cwd=ROOT, env=env, timeout=600)
    assert "pass@1" in result.read_text()
