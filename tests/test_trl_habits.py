"""TRL habits in the Python API: a loaded model with its processing_class, transformers' TrainerCallbacks,
TRL's argument names, a rerun into the same output_dir, a DatasetDict, and reward functions that raise or
cannot take TRL's keyword call; each is used, or refused at construction naming the fix."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import build_tiny_model

from aepo_rl import AEPOTrainer
from aepo_rl.config import TRL_ALIASES, Config, ConfigError, load_config, set_key
from aepo_rl.hf_callbacks import trl_logs
from aepo_rl.rewards import RewardFunctionError, RewardSetupError, WeightedRewards
from aepo_rl.tasks.loaders import DatasetError

datasets = pytest.importorskip("datasets", reason="the [dev] extra installs datasets")
transformers = pytest.importorskip("transformers")

TRAIN = [{"question": "What is 6 times 7?", "answer": "42"}, {"question": "What is 9 plus 1?", "answer": "10"}]
TEST = [{"question": "What is 40 plus 2?", "answer": "42"}]
SMALL = {"sft.epochs": 0, "rollout.n": 2, "rollout.max_response_length": 16, "rollout.max_tokens_per_round": 8,
         "rollout.premonitor_probe_tokens": 4, "trainer.batch_size": 2, "trainer.mini_batch_size": 1,
         "trainer.micro_batch_size": 2, "trainer.steps": 2, "trainer.tensorboard": False, "eval.samples": 1,
         "trainer.device": "cpu"}


def correct(prompts, completions, answer, **kwargs):
    return [float(a in c) for c, a in zip(completions, answer)]


# ---------------------------------------------------------------- names


def test_every_trl_alias_names_a_config_key():
    for name, key in TRL_ALIASES.items():
        cfg = Config()
        set_key(cfg, key, getattr(getattr(cfg, key.split(".")[0]), key.split(".")[1]))  # an unknown key raises


def test_trl_names_are_accepted_as_keyword_arguments_and_named_in_errors():
    trainer = AEPOTrainer(learning_rate=1e-5, num_generations=4, max_completion_length=32, epsilon_high=0.28,
                          max_steps=3, seed=7)
    cfg = trainer.cfg
    assert (cfg.trainer.lr, cfg.rollout.n, cfg.rollout.max_response_length, cfg.algorithm.clip_ratio_high,
            cfg.trainer.steps, cfg.trainer.seed) == (1e-5, 4, 32, 0.28, 3, 7)
    with pytest.raises(TypeError, match=r"cannot honour .*\n  loss_type='bnpo': the aggregations here are verl's"):
        AEPOTrainer(loss_type="bnpo")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'train_datset'; did you mean 'train_dataset'\?"):
        AEPOTrainer(train_datset=TRAIN)
    with pytest.raises(ConfigError,
                       match=r"unknown config key 'trainer.learning_rate'; TRL's learning_rate is trainer.lr"):
        AEPOTrainer(overrides={"trainer.learning_rate": 1e-5})
    with pytest.raises(ConfigError, match=r"unknown config key 'num_generations'; TRL's num_generations is rollout.n"):
        load_config(overrides=["num_generations=4"])


def test_common_trl_keyword_arguments_are_mapped(capsys):
    cfg = AEPOTrainer(beta=0.04, report_to="none", logging_steps=10, num_generations=4, per_device_train_batch_size=8,
                      gradient_accumulation_steps=2, loss_type="grpo", scale_rewards="none", lr_scheduler_type="cosine",
                      max_steps=20, warmup_ratio=0.1, use_cpu=True).cfg
    assert (cfg.algorithm.use_kl_loss, cfg.algorithm.kl_loss_coef, cfg.algorithm.kl_loss_type) == (True, 0.04, "k3")
    assert (cfg.trainer.tensorboard, cfg.trainer.wandb_project) == (False, None)
    # TRL: 8 completions per forward, 16 per optimizer step and per generation; groups of 4
    assert (cfg.trainer.micro_batch_size, cfg.trainer.mini_batch_size, cfg.trainer.batch_size) == (8, 4, 4)
    assert (cfg.algorithm.loss_agg_mode, cfg.algorithm.norm_adv_by_std, cfg.trainer.lr_schedule) == \
        ("seq-mean-token-mean", False, "cosine")
    assert (cfg.trainer.warmup_steps, cfg.trainer.device) == (2, "cpu")
    assert "logging_steps has no effect here: every RL step is logged" in capsys.readouterr().out
    assert AEPOTrainer(report_to=["tensorboard", "wandb"], project="mine").cfg.trainer.wandb_project == "mine"
    assert AEPOTrainer(beta=0.0).cfg.algorithm.use_kl_loss is False


def test_trl_keyword_arguments_that_cannot_be_honoured_are_refused_together_with_reasons():
    with pytest.raises(TypeError) as err:
        AEPOTrainer(report_to="mlflow", scale_rewards="batch", num_generations=3, per_device_train_batch_size=8,
                    lr_scheduler_type="linear", max_steps=-1)
    lines = str(err.value).splitlines()[1:]
    assert [line.split("=")[0].strip() for line in lines] == \
        ["max_steps", "report_to", "scale_rewards", "lr_scheduler_type", "per_device_train_batch_size"], lines
    assert "must both be multiples of num_generations=3" in lines[-1]
    with pytest.raises(TypeError, match=r"optim='sgd': the optimizer here is torch's AdamW"):
        AEPOTrainer(optim="sgd")
    AEPOTrainer(optim="adamw_torch_fused")


def test_args_takes_a_grpo_config_and_maps_what_the_user_set(tmp_path, capsys):
    pytest.importorskip("trl", reason="the [dev] extra installs trl")
    from trl import GRPOConfig

    from aepo_rl.integrations.trl import AEPOGRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path / "trl-run"), use_cpu=True, learning_rate=1e-5, num_generations=4,
                      per_device_train_batch_size=8, beta=0.04, logging_steps=5, report_to="tensorboard", max_steps=3,
                      epsilon_high=0.28, reward_weights=[1.0, 0.5])
    trainer = AEPOTrainer(args=args, train_dataset=TRAIN, reward_funcs=[correct, "exact_match"], tools=["python"])
    cfg = trainer.cfg
    assert (cfg.trainer.lr, cfg.rollout.n, cfg.trainer.steps, cfg.algorithm.clip_ratio_high) == (1e-5, 4, 3, 0.28)
    assert (cfg.trainer.batch_size, cfg.trainer.mini_batch_size, cfg.trainer.micro_batch_size) == (2, 2, 8)
    assert (cfg.algorithm.use_kl_loss, cfg.trainer.tensorboard) == (True, True)
    assert (cfg.trainer.run_dir, cfg.trainer.run_name) == (str(tmp_path), "trl-run")  # TRL's output_dir
    assert trainer.task.rewards.weights == [1.0, 0.5]
    out = capsys.readouterr().out.replace("\n", " ")
    # TRL's defaults are not the user's choice: the preset's values stand, and the note says which differ
    assert cfg.trainer.seed == 0 and cfg.rollout.max_response_length == load_config().rollout.max_response_length
    assert "left at TRL's defaults, so the preset's values stand:" in out and "seed 42 (here trainer.seed=0)" in out
    assert "learning_rate" not in out.split("left at TRL's defaults")[1]
    aepo_args = AEPOGRPOConfig(output_dir=str(tmp_path / "a"), use_cpu=True, aepo_entropy_adv_coef=0.5,
                               aepo_sg_upper_clip=False)
    cfg = AEPOTrainer(args=aepo_args).cfg
    assert (cfg.algorithm.entropy_adv_coef, cfg.algorithm.sg_upper_clip) == (0.5, False)
    with pytest.raises(TypeError, match=r"TRL args that aepo-rl cannot honour") as err:
        AEPOTrainer(args=GRPOConfig(output_dir=str(tmp_path / "b"), use_cpu=True, push_to_hub=True,
                                    use_liger_kernel=True))
    assert sorted(str(err.value).splitlines()[1:]) == ["  push_to_hub=True: aepo-rl has no counterpart",
                                                      "  use_liger_kernel=True: aepo-rl has no counterpart"]
    assert AEPOTrainer(args={"learning_rate": 2e-5}, learning_rate=3e-5).cfg.trainer.lr == 3e-5  # keywords win


def test_a_smaller_batch_size_carries_the_mini_batch_down_unless_it_was_set(tmp_path):
    assert load_config(overrides=["trainer.batch_size=2"]).trainer.mini_batch_size == 2
    (tmp_path / "my.yaml").write_text("trainer:\n  batch_size: 2\n")
    assert load_config(yaml_path=tmp_path / "my.yaml").trainer.mini_batch_size == 2
    assert AEPOTrainer(overrides={"trainer.batch_size": 3}).cfg.trainer.mini_batch_size == 3
    assert load_config(overrides=["trainer.batch_size=16"]).trainer.mini_batch_size == 4  # only down
    with pytest.raises(ConfigError, match=r"trainer.mini_batch_size=4 must be <= trainer.batch_size=2: lower "
                                          r"trainer.mini_batch_size, or leave it unset"):
        load_config(overrides=["trainer.batch_size=2", "trainer.mini_batch_size=4"])
    (tmp_path / "both.yaml").write_text("trainer:\n  batch_size: 2\n  mini_batch_size: 4\n")
    with pytest.raises(ConfigError, match="trainer.mini_batch_size=4 must be <="):
        load_config(yaml_path=tmp_path / "both.yaml")


def test_a_prompt_only_dataset_trains_when_no_reward_reads_an_answer(policy, tmp_path):
    def uses_python(prompts, completions, **kwargs):
        return [float("<python>" in c) for c in completions]

    prompts = [{"prompt": "Compute 6 times 7 with python."}, {"prompt": "Compute 9 plus 1 with python."}]
    model, tokenizer = policy
    trainer = AEPOTrainer(model=model, processing_class=tokenizer, train_dataset=prompts,
                          reward_funcs=[uses_python], tools=["python"], output_dir=tmp_path / "run",
                          overrides={**SMALL, "trainer.steps": 1})
    assert [ex.answers for ex in trainer.task.examples("train")] == [[], []]
    trainer.train()
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1
    with pytest.raises(DatasetError, match=r"train_dataset row 1: missing field 'answer' .*; the reward function "
                                           r"'correct' reads it \(prompt-only rows work when no reward function reads"):
        AEPOTrainer(train_dataset=prompts, reward_funcs=[correct], tools=["python"])
    with pytest.raises(DatasetError, match=r"eval_dataset row 1: missing field 'answer' .*; pass@k on eval_dataset "
                                           r"compares the final answer with it"):
        AEPOTrainer(train_dataset=prompts, eval_dataset=prompts, reward_funcs=[uses_python], tools=["python"])


def test_a_dataset_dict_gets_the_split_hint():
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(TRAIN),
                                   "test": datasets.Dataset.from_list(TEST)})
    with pytest.raises(DatasetError, match=r"train_dataset is a DatasetDict of splits \['train', 'test'\], as "
                                           r"load_dataset\(...\) returns: pass one split, "
                                           r"train_dataset=dataset\['train'\] "
                                           r"\(and eval_dataset=dataset\['test'\]\)"):
        AEPOTrainer(train_dataset=splits, reward_funcs=[correct], tools=["python"])


# ---------------------------------------------------------------- reward functions


def test_a_reward_without_kwargs_is_refused_at_construction_naming_it():
    def strict(prompts, completions, answer):
        return [0.0] * len(completions)

    with pytest.raises(RewardSetupError, match=r"reward function 'strict\(prompts, completions, answer\)' has no "
                                               r"\*\*kwargs.*def strict\(prompts, completions, answer, \*\*kwargs\)"):
        AEPOTrainer(train_dataset=TRAIN, reward_funcs=[strict], tools=["python"])


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_reward_that_raises_is_named_with_the_error(asynchronous):
    def lookup(prompts, completions, **kwargs):
        return [kwargs["gold"] for _ in completions]

    async def lookup_async(prompts, completions, **kwargs):
        return lookup(prompts, completions, **kwargs)

    rewards = WeightedRewards([lookup_async if asynchronous else lookup])
    name = "lookup_async" if asynchronous else "lookup"
    with pytest.raises(RewardFunctionError, match=rf"reward function '{name}' raised KeyError: 'gold' \(called with 2 "
                                                  r"completions and the keyword arguments prompts, completions, "
                                                  r"completion_ids, answer\); fix the function"):
        rewards(["q", "q"], ["a", "b"], [[1], [2]], {"answer": ["x", "x"]})


# ---------------------------------------------------------------- a model object, HF callbacks, reruns


class StopAfterFirstStep(transformers.TrainerCallback):
    """A user's transformers callback: records what it is called with, and stops training after step 1
    (once)."""

    def __init__(self):
        self.events = []

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.events.append(("train_begin", state.global_step, type(model).__name__, args.output_dir))

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("step_end", state.global_step))
        if state.global_step == 1 and not any(e[0] == "stopped" for e in self.events):
            self.events.append(("stopped",))
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.events.append(("log", state.global_step, logs["reward"] == logs["critic/score/mean"]))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.events.append(("evaluate", sorted(metrics)[:1]))

    def on_save(self, args, state, control, **kwargs):
        self.events.append(("save", state.global_step))

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append(("train_end", state.global_step))


@pytest.fixture
def policy(tiny_tokenizer):
    return build_tiny_model(tiny_tokenizer), tiny_tokenizer


def run_steps(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_model_object_trains_from_a_copy_in_the_run_folder(policy, tmp_path, capsys):
    model, tokenizer = policy
    with pytest.raises(TypeError,
                       match=r"model is a loaded Qwen3ForCausalLM: also pass its tokenizer as processing_class="):
        AEPOTrainer(model=model, train_dataset=TRAIN, reward_funcs=[correct], tools=["python"])
    with pytest.raises(TypeError, match=r"processing_class goes with a model object"):
        AEPOTrainer(model="models/x", processing_class=tokenizer)
    callback = StopAfterFirstStep()
    out = tmp_path / "runs" / "mine"
    args = dict(model=model, processing_class=tokenizer, train_dataset=TRAIN, eval_dataset=TEST,
                reward_funcs=[correct], tools=["python"], output_dir=out)
    trainer = AEPOTrainer(**args, callbacks=[callback], overrides=SMALL)
    results = trainer.train()
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["path"] == str(out / "start_model")
    assert (out / "start_model" / "model.safetensors").is_file() and (out / "start_model" / "tokenizer.json").is_file()
    assert results["rl"]["dataset/test"]["num_questions"] == 1
    # The HF callback was called as transformers' Trainer calls it, and its should_training_stop ended RL.
    assert run_steps(out) == [1]
    kinds = [e[0] for e in callback.events]
    assert kinds == ["evaluate", "train_begin", "step_end", "stopped", "log", "save", "evaluate", "train_end"]
    assert callback.events[1] == ("train_begin", 0, "Qwen3ForCausalLM", str(out))
    assert ("log", 1, True) in callback.events and ("save", 1) in callback.events

    # The same script again: refused with both choices named, then each choice works.
    again = AEPOTrainer(**args, overrides=SMALL)
    with pytest.raises(FileExistsError, match=r"train\(resume_from_checkpoint=True\).*overwrite_output_dir=True"):
        again.train()
    again = AEPOTrainer(**args, overrides=SMALL)
    again.train(resume_from_checkpoint=True)
    assert run_steps(out) == [1, 2]
    with pytest.raises(ConfigError, match=r"trainer.lr cannot change when continuing a run"):
        AEPOTrainer(**args, overrides=SMALL, learning_rate=0.5).train(resume_from_checkpoint=True)
    fresh = AEPOTrainer(**args, overrides={**SMALL, "trainer.steps": 1}, overwrite_output_dir=True)
    fresh.train()
    assert run_steps(out) == [1]

    # The command line cannot rebuild the datasets, rewards and tools: it says so and how to resume.
    from aepo_rl.cli import main

    capsys.readouterr()
    assert main(["train", "--resume", str(out), "trainer.steps=2"]) == 2
    assert (f"{out} was made by AEPOTrainer from Python datasets (2 training rows, 1 evaluation rows, reward functions "
            f"['correct'], tools ['python'])") in capsys.readouterr().err


def test_trl_log_names_and_frac_reward_zero_std():
    logs = trl_logs({"critic/score/mean": 0.5, "response_length/mean": 12.0, "rollout/informative_group_frac": 0.25})
    assert logs["reward"] == 0.5 and logs["completions/mean_length"] == 12.0
    assert logs["frac_reward_zero_std"] == 0.75
    assert "frac_reward_zero_std" not in trl_logs({"critic/score/mean": 0.5})


def test_rows_without_demonstrations_and_sft_asked_for_fail_before_a_model_is_built(monkeypatch, tmp_path):
    from aepo_rl.errors import UserError

    monkeypatch.setattr("aepo_rl.train.pipeline.load_policy", lambda *a, **k: pytest.fail("a model was built"))
    trainer = AEPOTrainer(train_dataset=TRAIN, reward_funcs=[correct], tools=["python"], output_dir=tmp_path / "run")
    with pytest.raises(UserError, match=r"task 'dataset' has no demonstrations for cold-start SFT.*set sft.epochs=0"):
        trainer.train()
    assert not (tmp_path / "run").exists()  # the failed start left nothing behind


def test_a_wrong_model_path_or_callback_is_refused_at_construction(tmp_path, monkeypatch):
    from aepo_rl.models import ModelPathError

    (tmp_path / "models" / "Qwen3-0.6B").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelPathError, match=r"model.path='models/qwen3-0.6b': no such folder .*did you mean "
                                             r"'models/Qwen3-0.6B'\?"):
        AEPOTrainer(model="models/qwen3-0.6b")

    class NeedsArguments(transformers.TrainerCallback):
        def __init__(self, threshold):
            self.threshold = threshold

    with pytest.raises(TypeError, match=r"callbacks\[0\]: the class NeedsArguments cannot be built without arguments"):
        AEPOTrainer(callbacks=[NeedsArguments])
    assert AEPOTrainer(callbacks=[NeedsArguments(0.5)]).callbacks[0].callback.threshold == 0.5


def test_resume_from_checkpoint_takes_true_and_not_with_overwrite(tmp_path):
    with pytest.raises(TypeError, match=r"resume_from_checkpoint='runs/x/checkpoint-5': give True"):
        AEPOTrainer(output_dir=tmp_path / "run").train(resume_from_checkpoint="runs/x/checkpoint-5")
    with pytest.raises(TypeError, match=r"overwrite_output_dir=True deletes it: choose one"):
        AEPOTrainer(output_dir=tmp_path / "run", overwrite_output_dir=True).train(resume_from_checkpoint=True)
    assert not (tmp_path / "run").exists()


def test_an_hf_callback_that_cannot_get_its_arguments_is_refused_at_construction(monkeypatch):
    def no_accelerate(self, *args, **kwargs):
        raise ImportError("Using the Trainer with PyTorch requires accelerate")

    monkeypatch.setattr(transformers.TrainingArguments, "__init__", no_accelerate)
    with pytest.raises(TypeError, match=r"callbacks\[0\] \(StopAfterFirstStep\) is a transformers.TrainerCallback.*"
                                        r"pip install accelerate, or subclass aepo_rl.TrainerCallback"):
        AEPOTrainer(callbacks=[StopAfterFirstStep()])
