"""The ``aepo_tree``/``aepo_chain`` agent loops through verl 0.9.1's own agent-loop registry and
``hydra.utils.instantiate`` (as its V1 worker builds them), n concurrent sessions per prompt, against a
fake ``LLMServerClient`` whose ``generate`` runs the tiny Qwen3 through HFEngine (steered into the tool
protocol as in test_rollout_tiny.py). Marked ``verl``; runs in .venv-verl (.ci/run)."""

from __future__ import annotations

import asyncio
import copy
import inspect

import pytest
import torch

pytestmark = pytest.mark.verl
pytest.importorskip("verl", reason="verl is not installed here: the verl tests run in .venv-verl "
                            "(.ci/run, docs/verl.md)")

from fakes import EchoSearch  # noqa: E402
from helpers import SteeredQwen3, steer  # noqa: E402
from transformers import Qwen3ForCausalLM  # noqa: E402

from aepo_rl import registry  # noqa: E402
from aepo_rl.engines.base import SamplingParams  # noqa: E402
from aepo_rl.engines.hf import HFEngine  # noqa: E402

N = 4
RESPONSE = 64
STEPS = 7


class HFServer:
    """verl's ``LLMServerClient.generate`` contract over HFEngine: one fresh sequence per request, the
    sampled tokens (stop string included) and their log-probs, stop_reason "completed" as verl's vLLM
    server reports both stop and length. ``fail`` / ``hang``: request ids that raise / never answer."""

    def __init__(self, model, tokenizer, fail=(), hang=(), report_steps=True):
        self.engine = HFEngine(model, tokenizer, seed=3)
        self.report_steps = report_steps
        self.calls: list[tuple[str, list[int], dict]] = []
        self.fail, self.hang = set(fail), set(hang)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        await asyncio.sleep(0)  # let the other sessions' requests interleave
        if request_id in self.fail:
            raise RuntimeError(f"replica serving {request_id} is down")
        if request_id in self.hang:
            await asyncio.Event().wait()
        temperature = sampling_params["temperature"]
        params = SamplingParams(temperature=temperature or 1.0, top_p=sampling_params["top_p"],
                                top_k=max(0, sampling_params["top_k"]), greedy=temperature == 0,
                                stop=tuple(sampling_params.get("stop", ())))
        seq = self.engine.add_sequence(list(prompt_ids))
        segment = self.engine.generate([seq], params, [sampling_params["max_tokens"]])[0]
        self.engine.release(seq)
        return TokenOutput(token_ids=segment.token_ids, log_probs=segment.logprobs, stop_reason="completed",
                           extra_fields={"global_steps": STEPS} if self.report_steps else {})


class SteeredAnyVersion(SteeredQwen3):
    """test_rollout_tiny's steered model, with the cache keyword of whichever transformers is installed
    (verl pins transformers < 5.11, whose Qwen3 takes ``past_key_values``; HFEngine reads the signature)."""

    def forward(self, input_ids=None, logits_to_keep=0, **kwargs):
        out = Qwen3ForCausalLM.forward(self, input_ids=input_ids, logits_to_keep=logits_to_keep, **kwargs)
        k = out.logits.shape[1]
        out.logits = out.logits + self.steering[input_ids[:, -k:]]
        return out

    forward.__signature__ = inspect.signature(Qwen3ForCausalLM.forward)


@pytest.fixture(scope="module")
def steered(tiny_model, tiny_tokenizer):
    model = steer(tiny_model, tiny_tokenizer)
    model.__class__ = SteeredAnyVersion
    return model


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer):
    """The tiny tokenizer whose generation prompt ends in a closed think block, so the steered model
    opens a search at once (test_rollout_tiny.py appends the same tokens to its prompts)."""
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = tok.chat_template.replace("<|im_start|>assistant\n{% endif %}",
                                                  "<|im_start|>assistant\n<think>go</think>{% endif %}")
    return tok


@pytest.fixture(scope="module")
def echo_task():
    """A task registered the way a user registers one: its only tool is EchoSearch."""
    search = EchoSearch()

    class EchoTask:
        name = "verl_echo"

        def tools(self):
            return {"search": search}

    registry.register_task("verl_echo")(lambda cfg: EchoTask())
    yield search
    del registry.TASKS["verl_echo"]


def trainer_config(**aepo):
    from omegaconf import OmegaConf

    custom = {"aepo": {"task": {"name": "verl_echo"}, "max_tokens_per_round": 16, "max_tool_response_tokens": 6,
                       "call_limit": 3, "global_samples": 2, "branch_threshold": 0.3, **aepo}}
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"n": N, "prompt_length": 64, "response_length": RESPONSE,
                                          "temperature": 1.0, "top_p": 1.0, "top_k": -1, "calculate_log_probs": True,
                                          "custom": custom}},
        "data": {"apply_chat_template_kwargs": {}},
    })


def make_loop(name, config, server, tokenizer):
    """An agent loop exactly as verl's AgentLoopWorker._run_agent_loop builds one."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    return hydra.utils.instantiate(config=_agent_loop_registry[name], trainer_config=DictConfigWrap(config=config),
                                   server_manager=server, tokenizer=tokenizer, processor=None, hf_model_type=None,
                                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
                                   tools=ToolListWrap([]))


SAMPLING = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True)


async def sessions(uids, config, server, tokenizer, name="aepo_tree", n=N):
    """verl V1's _run_prompt for every uid at once: n sessions each, all concurrent, errors returned."""
    tasks = []
    for uid in uids:
        for i in range(n):
            loop = make_loop(name, config, server, tokenizer)
            raw = [{"role": "user", "content": f"who founded Velmora ({uid})?"}]
            tasks.append(loop.run(dict(SAMPLING), uid=uid, session_id=i, global_steps=STEPS, raw_prompt=raw,
                                  index=0, agent_name=name))
    return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=300)


def result_blocks(mask):
    spans, start = [], None
    for i, m in enumerate(list(mask) + [1]):
        if m == 0 and start is None:
            start = i
        elif m == 1 and start is not None:
            spans.append((start, i))
            start = None
    return spans


def test_tree_sessions_are_the_leaves_of_one_tree(steered, tokenizer, echo_task, monkeypatch):
    from aepo_rl.integrations.verl import agent_loop

    monkeypatch.setattr(agent_loop._AEPOLoopBase, "coordinators", {})  # strong keys: outlive asyncio.run's loop
    server = HFServer(steered, tokenizer)
    outputs = asyncio.run(sessions(["p0", "p1"], trainer_config(), server, tokenizer))
    assert not [o for o in outputs if isinstance(o, BaseException)], outputs
    prefix = tokenizer.encode(" <result>\n", add_special_tokens=False)
    forks = calls = 0
    for g, uid in enumerate(["p0", "p1"]):
        leaves = outputs[g * N:(g + 1) * N]
        # leaf i for session i, all of one prompt, one tree
        assert [o.extra_fields["aepo_traj_id"] for o in leaves] == list(range(N))
        assert len({tuple(o.prompt_ids) for o in leaves}) == 1
        assert {o.extra_fields["aepo_global_samples"] for o in leaves} == {2}
        assert {o.extra_fields["aepo_branches"] for o in leaves} == {sum(o.extra_fields["aepo_parent_id"] >= 0
                                                                         for o in leaves)}
        # every request of the tree went out under the prompt's uid (sticky routing)
        prompt = leaves[0].prompt_ids
        requests = [c for c in server.calls if c[1][:len(prompt)] == prompt]
        assert requests and {c[0] for c in requests} == {uid}
        assert all(c[2]["logprobs"] and c[2]["include_stop_str_in_output"] for c in requests)
        for o in leaves:
            extra = o.extra_fields
            assert len(o.response_ids) == len(o.response_mask) == len(o.response_logprobs) <= RESPONSE
            assert extra["min_global_steps"] == extra["max_global_steps"] == STEPS
            if extra["aepo_parent_id"] >= 0:
                forks += 1
                parent, point = leaves[extra["aepo_parent_id"]], extra["aepo_fork_token_index"]
                assert o.response_ids[:point] == parent.response_ids[:point]
                assert o.response_logprobs[:point] == parent.response_logprobs[:point]
                assert extra["aepo_depth"] == parent.extra_fields["aepo_depth"] + 1
            # mask 0 exactly on the result blocks, which hold EchoSearch's answers
            spans = result_blocks(o.response_mask)
            assert len(spans) == extra["aepo_num_tool_calls"]
            calls += len(spans)
            for a, b in spans:
                block = tokenizer.decode(o.response_ids[a:b], skip_special_tokens=False)
                assert o.response_ids[a:a + len(prefix)] == prefix[:b - a]
                assert block.startswith(" <result>\nfound ")
                assert all(lp == 0.0 for lp in o.response_logprobs[a:b])
            # log-probs of the generated tokens = one plain forward of the model on prompt + response
            ids = torch.tensor([o.prompt_ids + o.response_ids])
            with torch.no_grad():
                logp = torch.log_softmax(steered(input_ids=ids).logits[0, :-1].float(), -1)
            p = len(o.prompt_ids)
            expected = logp[p - 1:].gather(1, ids[0, p:, None])[:, 0]
            m = torch.tensor(o.response_mask, dtype=torch.bool)
            torch.testing.assert_close(torch.tensor(o.response_logprobs)[m], expected[m], atol=1e-4, rtol=0)
    assert forks > 0 and calls > 0
    assert echo_task.calls
    coordinators = list(agent_loop._AEPOLoopBase.coordinators.items())
    assert len(coordinators) == 1 and all(c.loop is loop and len(c) == 0 for loop, c in coordinators)
    assert len(next(iter(coordinators))[1]._tools) == 1  # the task's tools, built once for all 8 sessions


def test_a_failing_or_hanging_tree_fails_its_sessions_without_stopping_the_others(steered, tokenizer, echo_task,
                                                                                  monkeypatch):
    from aepo_rl.integrations.verl import agent_loop

    monkeypatch.setattr(agent_loop._AEPOLoopBase, "coordinators", {})
    server = HFServer(steered, tokenizer, fail={"bad"}, hang={"stuck"})
    outputs = asyncio.run(sessions(["good", "bad", "stuck"], trainer_config(tree_timeout=20), server, tokenizer))
    good, bad, stuck = outputs[:N], outputs[N:2 * N], outputs[2 * N:]
    assert not [o for o in good if isinstance(o, BaseException)], good
    assert [o.extra_fields["aepo_traj_id"] for o in good] == list(range(N))
    assert all(isinstance(o, RuntimeError) and "bad is down" in str(o) for o in bad), bad
    assert all(isinstance(o, TimeoutError) and "tree_timeout" in str(o) for o in stuck), stuck
    assert len(agent_loop._AEPOLoopBase.coordinators) == 1
    assert all(len(c) == 0 for c in agent_loop._AEPOLoopBase.coordinators.values())


def test_global_step_tags_are_set_when_the_server_reports_none(steered, tokenizer, echo_task):
    """Review L3: verl's V1 trainer builds an int array of every leaf's min/max_global_steps; a server that
    reports no weight version leaves the prompt's global_steps there, never None."""
    outputs = asyncio.run(sessions(["q"], trainer_config(), HFServer(steered, tokenizer, report_steps=False),
                                   tokenizer))
    assert not [o for o in outputs if isinstance(o, BaseException)], outputs
    assert ({(o.extra_fields["min_global_steps"], o.extra_fields["max_global_steps"]) for o in outputs}
            == {(STEPS, STEPS)})


def test_tree_timings_split_server_time_from_the_rest(steered, tokenizer, echo_task):
    """Review L8: verl's agent_loop/* timings get the tree's time waiting for the server as
    generate_sequences and the rest (tools, controller) as tool_calls, no longer all as generation."""
    outputs = asyncio.run(sessions(["t"], trainer_config(), HFServer(steered, tokenizer), tokenizer))
    timings = {(o.metrics.generate_sequences, o.metrics.tool_calls) for o in outputs}
    assert len(timings) == 1  # one tree, one timing
    generate, tools = timings.pop()
    assert generate > 0 and tools > 0


def test_a_validation_row_on_the_tree_loop_warns():
    """Review L5: validation sampling (val_kwargs.temperature) reaching aepo_tree is named in a warning."""
    from omegaconf import OmegaConf

    from aepo_rl.integrations.verl.agent_loop import _warn_if_validation

    rollout = OmegaConf.create({"temperature": 1.0, "val_kwargs": {"temperature": 0}})
    with pytest.warns(UserWarning, match="agent_name=aepo_chain"):
        _warn_if_validation(rollout, {"temperature": 0.0})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_validation(rollout, {"temperature": 1.0})  # training sampling: silent


def test_chain_sessions_are_independent_greedy_trajectories(steered, tokenizer, echo_task, monkeypatch):
    import threading

    from aepo_rl.rollout import tree

    threads = []
    real = tree.run_rollout
    monkeypatch.setattr(tree, "run_rollout", lambda *a, **k: threads.append(threading.current_thread().name)
                        or real(*a, **k))
    server = HFServer(steered, tokenizer)
    sampling = dict(SAMPLING, temperature=0)

    async def run():
        loops = [make_loop("aepo_chain", trainer_config(), server, tokenizer) for _ in range(2)]
        raw = [{"role": "user", "content": "who founded Velmora?"}]
        return await asyncio.gather(*(lp.run(dict(sampling), uid="v", session_id=i, global_steps=STEPS, raw_prompt=raw)
                                      for i, lp in enumerate(loops)))

    a, b = asyncio.run(run())
    assert a.response_ids == b.response_ids and a.extra_fields["aepo_parent_id"] == -1
    assert {c[2]["temperature"] for c in server.calls} == {0.0}
    assert {c[0] for c in server.calls} == {"v/0", "v/1"}
    # grown in the coordinator's pool, not the event loop's default executor verl shares (review L6)
    assert len(threads) == 2 and all(name.startswith("aepo-tree") for name in threads), threads


def test_custom_keys_are_checked_with_their_verl_names():
    from aepo_rl.config import ConfigError
    from aepo_rl.integrations.verl.agent_loop import loop_settings

    rollout = trainer_config().actor_rollout_ref.rollout
    settings = loop_settings(rollout)
    assert settings.rollout.n == N and settings.rollout.max_response_length == RESPONSE
    assert settings.rollout.entropy_measure == "surprisal" and settings.rollout.global_samples == 2
    assert settings.rollout.entropy_reduce == "sum"  # the release's ΔH scale (§1.2), as every aepo_rl rollout
    mean_settings = loop_settings(trainer_config(entropy_reduce="mean").actor_rollout_ref.rollout)
    assert mean_settings.rollout.entropy_reduce == "mean"
    for bad, message in [({"n": 3}, "use actor_rollout_ref.rollout.n"),
                         ({"entropy_wieght": 0.2}, r"custom\.aepo\.entropy_wieght"),
                         ({"entropy_measure": "full"}, "use surprisal"),
                         ({"branch_threshold": 2}, r"custom\.aepo\.branch_threshold=2(\.0)? is out of range")]:
        broken = trainer_config(**bad).actor_rollout_ref.rollout
        with pytest.raises(ConfigError, match=message):
            loop_settings(broken)


def test_finish_reason_is_recovered_from_the_tokens(tokenizer):
    from aepo_rl.integrations.verl.agent_loop import finish_reason

    eos = {tokenizer.eos_token_id}
    ids = tokenizer.encode("abc <search>x</search>", add_special_tokens=False)
    assert finish_reason(ids, tokenizer, eos, ("</search>", "</answer>")) == ("stop", "</search>")
    assert finish_reason(ids + [tokenizer.eos_token_id], tokenizer, eos, ("</search>",)) == ("eos", None)
    assert finish_reason(ids[:-1], tokenizer, eos, ("</search>",)) == ("length", None)
    assert finish_reason([], tokenizer, eos, ("</search>",)) == ("length", None)


def test_one_coordinator_per_event_loop_gone_with_its_loop():
    """The sessions of one event loop share one coordinator (trees, tools); a loop that is closed and dropped
    takes its coordinator along (weak keys: no module-level state, nothing kept per dead loop)."""
    import gc
    import types

    from aepo_rl.integrations.verl import agent_loop

    class Loop(agent_loop._AEPOLoopBase):
        def __init__(self):  # verl's constructor needs a whole worker; the coordinator needs the settings only
            self.settings = types.SimpleNamespace(max_concurrent_trees=2)

        async def run(self, sampling_params, **kwargs):
            raise NotImplementedError

    async def two_sessions():
        first, second = Loop().coordinator(), Loop().coordinator()
        return first, second, asyncio.get_running_loop()

    before = len(agent_loop._AEPOLoopBase.coordinators)
    first, second, loop = asyncio.run(two_sessions())
    assert first is second and first.loop is loop
    assert len(agent_loop._AEPOLoopBase.coordinators) == before + 1
    del loop
    gc.collect()
    assert first.loop is None and len(agent_loop._AEPOLoopBase.coordinators) == before
