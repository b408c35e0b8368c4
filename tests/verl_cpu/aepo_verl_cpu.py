"""Test harness: verl 0.9.1's own ``main_ppo`` on a CPU, with an HF-backed rollout server.

Test code, not part of aepo-rl. verl loads it in every process that imports verl (the driver, the
TaskRunner, the FSDP worker, the agent-loop and reward workers, the rollout server) through its
external-module hook, ``VERL_USE_EXTERNAL_MODULES=aepo_verl_cpu`` with this folder on PYTHONPATH
(tests/test_verl_e2e_on_cpu.py sets both in Ray's runtime environment). It adds, without changing
verl's code:

- ``PlatformCPU``: verl's platform plugin API (``VERL_PLATFORM=cpu``); device ``cpu``, backend
  ``gloo``, Ray resource ``GPU`` (the test starts Ray with fake GPUs), a ``torch.cpu``-based device
  module with the CUDA-only calls verl makes as no-ops;
- the process group: verl asks for ``"cpu:gloo,<device>:<backend>"``, which torch refuses when both
  devices are ``cpu``; one ``gloo`` backend is asked instead;
- the ``hf_cpu`` rollout: a :class:`RolloutReplica` (verl's replica registry) starting one
  :class:`HFServer` Ray actor, which serves verl's token-in/token-out ``generate`` contract with
  aepo-rl's own HF engine (stop strings, sampled log-probs), and :class:`HFServerAdapter`, the
  hybrid worker's rollout (verl's rollout registry) whose ``update_weights`` ships the trainer's
  weights to that actor after every step. Sleep/wake/KV-cache calls are no-ops.
- :class:`SpyAgentLoopManager`: verl's V1 agent-loop manager whose workers also write every
  trajectory they put into TransferQueue (ids, response mask, ``extra_fields``) to
  ``$AEPO_E2E_DIR/trajectories.jsonl`` for the test to read.

``AEPO_E2E_STEER=1`` adds a fixed logit bias to the server's model (tests/test_rollout_tiny.py's
``steer``), so a tiny random model writes tool calls; the trained weights are the model's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import types
from contextlib import nullcontext

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

# ---------------------------------------------------------------------------------- platform


def _noop(*args, **kwargs):
    return None


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` plus what verl calls on its device module that ``torch.cpu`` lacks."""

    def __init__(self):
        super().__init__("aepo_verl_cpu_device")
        self.empty_cache = self.ipc_collect = self.set_device = self.set_per_process_memory_fraction = _noop
        self.memory_allocated = self.memory_reserved = lambda *a, **k: 0
        self.max_memory_allocated = self.max_memory_reserved = lambda *a, **k: 0
        self.mem_get_info = lambda *a, **k: (1 << 34, 1 << 34)
        self.get_rng_state = lambda *a, **k: torch.get_rng_state()
        self.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
        self.is_available = lambda: True
        self.device_count = lambda: 1
        self.get_device_name = lambda *a, **k: "cpu"
        self.manual_seed = self.manual_seed_all = torch.manual_seed

    def __getattr__(self, name):
        return getattr(torch.cpu, name)


_DEVICE = _CPUDeviceModule()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    device_name = property(lambda self: "cpu")
    vendor_name = property(lambda self: "cpu")
    device_module = property(lambda self: _DEVICE)

    def is_available(self):
        return True

    def current_device(self):
        return "cpu"  # not 0: verl's .to(get_device_id()) would mean cuda:0

    def device_count(self):
        return 1

    def set_device(self, device_index):
        return None

    def synchronize(self, device_index=None):
        return None

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings):
        return None

    def empty_cache(self):
        return None

    def get_device_capability(self, device_index=0):
        return None, None

    def communication_backend_name(self):
        return "gloo"

    def visible_devices_envvar(self):
        return "CUDA_VISIBLE_DEVICES"

    def nvtx_range(self, msg):
        return nullcontext()

    def profiler_start(self):
        return None

    def profiler_stop(self):
        return None

    def ray_resource_name(self):
        return "GPU"

    def ray_noset_envvars(self):
        return []

    def is_ipc_supported(self):
        return False

    def cudart(self):
        return None


# ---------------------------------------------------------------------------------- process group

def _one_gloo_backend() -> None:
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None or backend.count("cpu:") > 1:
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


_one_gloo_backend()


# ---------------------------------------------------------------------------------- the HF rollout

SERVER_PREFIX = "hf_cpu_server_"


def _record(name: str, row: dict) -> None:
    out = os.environ.get("AEPO_E2E_DIR")
    if out:
        with open(os.path.join(out, name), "a") as f:
            f.write(json.dumps(row) + "\n")


class HFServer:
    """One rollout server: verl's ``generate(request_id, *, prompt_ids, sampling_params)`` over
    aepo-rl's HFEngine. Requests that arrive together with the same sampling settings are decoded
    as one batch (a tree's round sends its sequences together)."""

    def __init__(self, model_path: str, seed: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from aepo_rl.engines.hf import HFEngine

        torch.set_num_threads(1)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        if os.environ.get("AEPO_E2E_STEER") == "1":
            model = _steered(model, self.tokenizer)
        self.model = model
        self.initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.engine = HFEngine(model, self.tokenizer, seed=seed)
        self.global_steps = None
        self.queue: list = []
        self.draining = False

    def ready(self) -> bool:
        return True

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if float(sampling_params.get("repetition_penalty", 1.0)) != 1.0:
            raise ValueError("hf_cpu server: repetition_penalty is not supported")
        key = (float(sampling_params["temperature"]), float(sampling_params.get("top_p", 1.0)),
               int(sampling_params.get("top_k", -1)), tuple(sampling_params.get("stop", ()) or ()))
        future = asyncio.get_running_loop().create_future()
        self.queue.append((key, list(prompt_ids), int(sampling_params["max_tokens"]), future))
        if not self.draining:
            self.draining = True
            asyncio.get_running_loop().create_task(self._drain())
        tokens, logprobs = await future
        return TokenOutput(token_ids=tokens, log_probs=logprobs, stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps})

    async def _drain(self):
        from aepo_rl.engines.base import SamplingParams

        try:
            await asyncio.sleep(0.05)  # let the other requests of the round arrive
            while self.queue:
                key = self.queue[0][0]
                batch = [r for r in self.queue if r[0] == key]
                self.queue = [r for r in self.queue if r[0] != key]
                temperature, top_p, top_k, stop = key
                params = SamplingParams(temperature=temperature or 1.0, top_p=top_p, top_k=max(top_k, 0),
                                        greedy=temperature == 0, stop=stop)
                try:
                    seqs = [self.engine.add_sequence(prompt) for _, prompt, _, _ in batch]
                    segments = self.engine.generate(seqs, params, [budget for _, _, budget, _ in batch])
                    for seq in seqs:
                        self.engine.release(seq)
                except Exception as error:  # fail the requests, keep serving
                    for *_, future in batch:
                        future.set_exception(error)
                    continue
                for (*_, future), segment in zip(batch, segments):
                    future.set_result((list(segment.token_ids), [float(x) for x in segment.logprobs]))
                await asyncio.sleep(0)
        finally:
            self.draining = False

    async def update_weights(self, state: dict, global_steps=None):
        """Load the trainer's weights (HF names); record how far they moved from the initial ones."""
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise KeyError(f"hf_cpu server: weights {unknown[:5]} are not parameters of the rollout model")
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))
        change = max(float((own[k] - self.initial[k]).abs().max()) for k in state)
        self.global_steps = global_steps
        _record("weights.jsonl", {"global_steps": global_steps, "tensors": len(state), "max_abs_change": change})
        out = os.environ.get("AEPO_E2E_DIR")
        if out:  # the latest weights, for the test's comparison with verl's merged checkpoint
            torch.save({k: v.clone() for k, v in own.items()}, os.path.join(out, "rollout_weights.pt"))

    async def set_global_steps(self, global_steps):
        self.global_steps = global_steps

    async def abort_all_requests(self, reject_request: bool = False):
        return {"aborted_count": 0, "request_ids": []}

    async def wake_up(self, tags=None):
        return None

    sleep = clear_kv_cache = release_kv_cache = resume_kv_cache = resume_generation = wake_up

    async def start_profile(self, **kwargs):
        return None

    stop_profile = start_profile


def _steered(model, tokenizer):
    """tests/test_rollout_tiny.py's bigram logit bias, on the installed transformers' Qwen3."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from helpers import steer
    from test_verl_agent_loop_on_cpu import SteeredAnyVersion

    steered = steer(model, tokenizer)
    steered.__class__ = SteeredAnyVersion
    return steered


def _load_replica():
    import ray
    from verl.workers.rollout.replica import RolloutReplica

    class HFReplica(RolloutReplica):
        """One HFServer actor per replica; the hybrid worker's adapter finds it by name."""

        async def launch_servers(self):
            path = getattr(self.model_config, "local_path", None) or self.model_config.path
            name = f"{SERVER_PREFIX}{self.replica_rank}"
            server = ray.remote(HFServer).options(name=name, max_concurrency=self.max_concurrency,
                                                  num_cpus=0).remote(model_path=path)
            await server.ready.remote()
            self.servers = [server]
            self._server_handle = server
            self._server_address = name

        async def sleep(self):
            return None

        async def wake_up(self):
            return None

    return HFReplica


def _register_rollout() -> None:
    from verl.workers.rollout import base, replica

    replica.RolloutReplicaRegistry.register("hf_cpu", _load_replica)
    base._ROLLOUT_REGISTRY[("hf_cpu", "async")] = f"{__name__}.HFServerAdapter"


_register_rollout()


def __getattr__(name):  # the adapter subclasses verl's BaseRollout: built on first use, in the worker
    if name == "HFServerAdapter":
        return _adapter_class()
    if name == "SpyAgentLoopManager":
        return _spy_manager_class()
    raise AttributeError(name)


def _adapter_class():
    import ray
    from verl.workers.rollout.base import BaseRollout

    class HFServerAdapter(BaseRollout):
        """The hybrid worker's rollout: ships the trainer's full weights to its replica's HFServer."""

        def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
            super().__init__(config, model_config, device_mesh)
            world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
            rank = int(os.environ.get("RANK", 0))
            self.replica_rank = rank // world if replica_rank == -1 else replica_rank
            self.leader = rank % world == 0

        async def resume(self, tags):
            return None

        async def release(self):
            return None

        async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
            if wire_format != "named_tensors":
                raise ValueError(f"hf_cpu rollout: wire_format {wire_format!r} is not supported")
            state = {}
            for name, tensor in weights:
                if hasattr(tensor, "full_tensor"):
                    tensor = tensor.full_tensor()
                state[name] = tensor.detach().to("cpu").clone()
            if self.leader:
                server = ray.get_actor(f"{SERVER_PREFIX}{self.replica_rank}")
                await server.update_weights.remote(state, global_steps)

    return HFServerAdapter


def _spy_manager_class():
    import ray
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

    base = AgentLoopWorkerTQ.__ray_actor_class__

    class SpyWorker(base):
        async def _agent_loop_postprocess(self, output, validate, **kwargs):
            for out in output if isinstance(output, list) else [output]:
                _record("trajectories.jsonl", {
                    "uid": str(kwargs.get("uid")), "session_id": int(kwargs.get("session_id", -1)),
                    "global_steps": kwargs.get("global_steps"), "validate": bool(validate),
                    "prompt_ids": list(out.prompt_ids), "response_ids": list(out.response_ids),
                    "response_mask": list(out.response_mask),
                    "extra_fields": {k: v for k, v in out.extra_fields.items() if k.startswith("aepo_")
                                     or k.endswith("global_steps")}})
            return await super()._agent_loop_postprocess(output, validate, **kwargs)

    class SpyAgentLoopManager(AgentLoopManagerTQ):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.agent_loop_workers_class = ray.remote(SpyWorker)

    return SpyAgentLoopManager


# ---------------------------------------------------------------------------------- reward

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """The plugin's reward (aepo_rl.integrations.verl.reward) plus 0.01 per character of the response.
    The tiny random model never answers right, so a group's §3 scores are usually all equal and GRPO's
    advantages (hence the policy gradient) 0; the leaves of a tree differ in length, so with the length
    term they do not."""
    from aepo_rl.integrations.verl.reward import compute_score as aepo_score

    return aepo_score(data_source, solution_str, ground_truth, extra_info, **kwargs) + 0.01 * len(solution_str)
