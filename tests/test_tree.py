"""Tree rollout controller (§1) driven by a scripted fake engine and fake tools."""

from __future__ import annotations

import math
import random
import threading

import pytest
from fakes import EchoSearch, FakeEngine
from helpers import ScriptedUniforms, calls_then_answer
from helpers import tree_cfg as cfg
from helpers import tree_prompts as prompts
from helpers import tree_tools as tools

from aepo_rl.config import RolloutConfig
from aepo_rl.engines.base import Segment
from aepo_rl.rollout import tree
from aepo_rl.rollout.entropy import branch_probability, premonitor_global_samples, step_entropy
from aepo_rl.rollout.metrics import subtree_roots
from aepo_rl.rollout.tree import run_rollout


class RaisingTool(EchoSearch):
    def run(self, arg):
        raise RuntimeError("index missing")


class BlockingTool(EchoSearch):
    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def run(self, arg):
        self.gate.wait(5)
        return "late"


# --- §1.4 branch probability -------------------------------------------------------------

@pytest.mark.parametrize("c, expected", [(0, 0.5), (1, 1 - 0.5 / 0.95), (2, 1 - 0.5 / 0.9), (5, 1 / 3),
                                         (10, 0.0), (14, 0.0)])
def test_branch_frequency_matches_table(c, expected):
    """ΔH = 0: P(branch) = 0.5, 0.474, 0.444, 0.333, 0 for c = 0, 1, 2, 5, ≥ 10 (§1.4)."""
    rng = random.Random(1234)
    draws = 40000
    hits = sum(branch_probability(rng.random(), 0.0, c, mode="aepo", entropy_weight=0.2, penalty=0.05) >= 0.5
               for _ in range(draws))
    assert abs(hits / draws - expected) < 0.01


def test_branch_probability_values():
    assert branch_probability(0.6, 0.0, 2, mode="aepo", entropy_weight=0.2, penalty=0.05) == pytest.approx(0.54)
    assert branch_probability(0.9, 1.0, 0, mode="aepo", entropy_weight=0.2, penalty=0.05) == 1.0  # clipped
    assert branch_probability(0.9, 1.0, 3, mode="arpo", entropy_weight=0.2, penalty=0.05) == pytest.approx(1.1)
    assert branch_probability(0.1, -1.0, 0, mode="aepo", entropy_weight=0.2, penalty=0.05) == 0.0


def test_entropy_measures_and_reductions():
    """§1.2: sum (default) or mean of the first K = min(k, len) token entropies, / ln|V|."""
    seg = Segment([1] * 30, [0.0] * 30, [float(i) for i in range(30)], [0.5] * 30)
    assert step_entropy(seg, "full", 20, 1000) == pytest.approx(190 / math.log(1000))  # sum of 0..19
    assert step_entropy(seg, "full", 20, 1000, "mean") == pytest.approx(9.5 / math.log(1000))
    assert step_entropy(seg, "top10_proxy", 20, 1000) == pytest.approx(10 / math.log(1000))  # sum of 20 × 0.5
    assert step_entropy(seg, "top10_proxy", 20, 1000, "mean") == pytest.approx(0.5 / math.log(1000))
    seg = Segment([1] * 30, [-0.1 * i for i in range(30)], [0.0] * 30, [])
    assert step_entropy(seg, "surprisal", 20, 1000) == pytest.approx(19 / math.log(1000))  # sum of 0.0..1.9
    assert step_entropy(seg, "surprisal", 20, 1000, "mean") == pytest.approx(0.95 / math.log(1000))
    short = Segment([1] * 4, [0.0] * 4, [1.0] * 4, [1.0] * 4)
    assert step_entropy(short, "full", 20, 1000) == pytest.approx(4 / math.log(1000))  # K = len = 4
    assert step_entropy(Segment([], [], [], []), "surprisal", 20, 1000) == 0.0
    with pytest.raises(ValueError, match="entropy_reduce 'max'"):
        step_entropy(short, "full", 20, 1000, "max")


def test_default_reduction_is_the_release_sum():
    """The default branching signal is on the release's scale: ΔH of +1 nat on each of 20 tokens is
    20 / ln|V|, not 1 / ln|V| (the mean of aepo-rl before 2026-12-05)."""
    assert RolloutConfig().entropy_reduce == "sum"
    base, up = (Segment([1] * 30, [0.0] * 30, [h] * 30, [h] * 30) for h in (1.0, 2.0))
    delta = step_entropy(up, "full", 20, 2048) - step_entropy(base, "full", 20, 2048)
    assert delta == pytest.approx(20 / math.log(2048))


def test_release_example_per_nat():
    """The release's own numbers (§1.2, §1.4): proxy summed over k = 20 tokens / ln 151,643 (Qwen3's
    vocabulary), w = 0.2: one nat more on every token of the segment adds 0.2·20/11.93 = 0.335 to P_t
    (34 points); a segment of 8 tokens adds 0.2·8/11.93 = 0.134; the mean of aepo-rl before the change
    added 0.2/ln 2048 = 0.026 at the tiny model's vocabulary."""
    vocab = 151_643

    def w_delta(tokens, k=20, reduce="sum", v=vocab, measure="top10_proxy"):
        lo, hi = (Segment([1] * tokens, [0.0] * tokens, [h] * tokens, [h] * tokens) for h in (0.7, 1.7))
        return 0.2 * (step_entropy(hi, measure, k, v, reduce) - step_entropy(lo, measure, k, v, reduce))
    assert math.log(vocab) == pytest.approx(11.929, abs=1e-3)
    assert w_delta(30) == pytest.approx(0.3353, abs=1e-4)
    assert w_delta(8) == pytest.approx(0.1341, abs=1e-4)
    assert w_delta(30, reduce="mean", v=2048, measure="full") == pytest.approx(0.0262, abs=1e-4)
    assert branch_probability(0.4, w_delta(30) / 0.2, 0, mode="arpo", entropy_weight=0.2, penalty=0.05) >= 0.5


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_three_measures_agree_when_the_top10_mass_is_one(reduce):
    """§1.2/§1.6: where each position's distribution is uniform over j ≤ 10 tokens (top-10 mass ≈ 1),
    full entropy, surprisal of the sampled token and the top-10 proxy are all ln j, so the three
    measures give the same H and the same ΔH. Token statistics come from real logits through the
    engine's own functions."""
    import torch

    from aepo_rl.algorithms import entropy_from_logits
    from aepo_rl.engines.sampling import release_top10_proxy

    vocab = 2048

    def segment(widths):
        logits = torch.full((len(widths), vocab), -40.0)
        for row, j in enumerate(widths):
            logits[row, :j] = 0.0
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = torch.tensor([j - 1 for j in widths])  # a token inside the top j
        chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
        assert float(logprobs[:, :10].exp().sum(-1).min()) > 1 - 1e-6  # top-10 mass
        return Segment(tokens.tolist(), chosen.tolist(), entropy_from_logits(logits).tolist(),
                       release_top10_proxy(logprobs, tokens).tolist())

    base, step = segment([1, 2, 3, 10, 5, 4, 2, 1] * 3), segment([10, 9, 8, 7, 6, 5] * 4)
    deltas = [step_entropy(step, m, 20, vocab, reduce) - step_entropy(base, m, 20, vocab, reduce)
              for m in ("full", "surprisal", "top10_proxy")]
    assert deltas[0] > 0.1
    assert deltas[1] == pytest.approx(deltas[0], rel=1e-5) and deltas[2] == pytest.approx(deltas[0], rel=1e-5)


def test_premonitor_formulas():
    assert premonitor_global_samples(12, 2.0, 2.0, formula="release", beta=0.5) == 7
    assert premonitor_global_samples(12, 2.0, 2.0, formula="paper", beta=0.5) == 6
    assert premonitor_global_samples(8, 3.0, 1.0, formula="paper", beta=0.5) == 6   # 8·σ(1) = 5.85
    assert premonitor_global_samples(8, 3.0, 1.0, formula="release", beta=0.5) == 6  # floor(5.85) + 1
    assert premonitor_global_samples(4, 0.0, 10.0, formula="paper", beta=0.5) == 1   # 0.03 → clamped
    assert premonitor_global_samples(12, 40.0, 0.0, formula="release", beta=0.5) == 12  # floor(11.99…) + 1


# --- the controller ----------------------------------------------------------------------

def test_premonitor_release_gives_7_of_12(tiny_tokenizer):
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(2, 0.0))  # equal step entropies whatever the lengths
    c = cfg(n=12, global_samples=None, premonitor=True, premonitor_formula="release", mode="aepo",
            branch_threshold=1.0, entropy_weight=0.0)  # never branch: restarts fill the rest
    result = run_rollout(engine, prompts(tiny_tokenizer, 2), tools(), c, seed=0)
    assert result.metrics["rollout/global_samples"] == 7
    for group in result.groups:
        assert [t.traj_id for t in group] == list(range(12))
        assert all(t.parent_id is None for t in group)
    # first round of the tree = 7 fresh sequences per prompt, after the probe (2 seqs) and the 3-round pre-rollout
    assert [len(b) for b in engine.batches[:5]] == [2, 2, 2, 2, 14]


def test_previous_segment_path_penalty(tiny_tokenizer):
    """Hand-computed: U = .9, .2, .9, .52; ΔH = 0; λ = 0.05; per-path counter l."""
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(3))
    result = run_rollout(engine, prompts(tiny_tokenizer), tools(), cfg(penalty_scope="path"),
                         rng=ScriptedUniforms([0.9, 0.2, 0.9, 0.52]))
    t0, t1, t2, t3 = result.groups[0]
    # round 1: T0 l=0 → P=.9 → T1.   round 2: T0 l=1 → .2·.95=.19 no (l=0); T1 l=1 → .9·.95 → T2 (l=2).
    # round 3: T0 l=0 → .52 → T3; prompt full.
    assert t0.rounds[0].branch_probability == pytest.approx(0.9)
    assert t0.rounds[1].branch_probability == pytest.approx(0.19)
    assert t0.rounds[2].branch_probability == pytest.approx(0.52)
    assert t1.rounds[1].branch_probability == pytest.approx(0.855)
    assert t1.rounds[2].branch_probability is None and t2.rounds[2].branch_probability is None
    assert [t.parent_id for t in (t0, t1, t2, t3)] == [None, 0, 1, 0]
    assert t1.fork_token_index == t0.rounds[0].end and t3.fork_token_index == t0.rounds[2].end
    assert t2.fork_token_index == t1.rounds[1].end
    assert result.metrics["rollout/consecutive_branch_max"] == 2
    assert result.metrics["rollout/branches_per_prompt"] == 3
    # branch events at l = 0 (T0, round 1), 1 (T1, round 2), 0 (T0, round 3); T0's round-2 refusal is a
    # decision too; T1 and T2 are not asked in round 3 (the prompt is full). ΔH = 0: no flip.
    m = result.metrics
    assert m["rollout/consecutive_branch_mean"] == pytest.approx(1 / 3)
    assert m["rollout/consecutive_branch_share/l0"] == pytest.approx(2 / 3)
    assert m["rollout/consecutive_branch_share/l1"] == pytest.approx(1 / 3)
    assert m["rollout/consecutive_branch_share/l2"] == 0 and m["rollout/consecutive_branch_share/l3plus"] == 0
    assert m["rollout/branch_decisions"] == 4 and m["rollout/entropy_leverage"] == 0
    assert result.branches.streaks == [0, 1, 0] and result.branches.streak_groups == [0, 0, 0]
    assert result.metrics["rollout/largest_subtree_share"] == 1.0
    assert all(t.finish_reason == "answer" for t in (t0, t1, t2, t3))


def test_entropy_leverage_counts_the_decisions_the_entropy_term_flips(tiny_tokenizer):
    """§1.4 with the release's previous segment, lineage baseline = round 0's entropy 3.0. Decision 1
    (round 0, ΔH = 0, U = .3): no branch either way. Decision 2 (round 1, entropy 1.0 < 3.0, U = .55):
    U alone would branch, U + w·ΔH does not: a flip. Decision 3 (round 2, ΔH = 0, U = .6): branches,
    no flip. A second rollout, where only T0 branches and four times in a row, fills the l = 0, 1, 2
    and ≥ 3 buckets."""
    entropies = {0: 3.0, 1: 1.0, 2: 3.0, 3: 3.0}
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(3, lambda s: entropies[s.rounds]))
    result = run_rollout(engine, prompts(tiny_tokenizer), tools(), cfg(n=2, mode="aepo"),
                         rng=ScriptedUniforms([0.3, 0.55, 0.6]))
    t0 = result.groups[0][0]
    assert t0.rounds[1].branch_probability < 0.5 <= 0.55 and t0.rounds[2].branch_probability == pytest.approx(0.6)
    m = result.metrics
    assert m["rollout/branch_decisions"] == 3 and m["rollout/entropy_leverage"] == pytest.approx(1 / 3)
    assert m["rollout/consecutive_branch_mean"] == 0 and m["rollout/consecutive_branch_share/l0"] == 1
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(4))
    result = run_rollout(engine, prompts(tiny_tokenizer), tools(), cfg(n=5, mode="arpo"),
                         rng=ScriptedUniforms([.9, .9, 0, .9, 0, 0, .9]))  # only T0 branches: l = 0, 1, 2, 3
    m = result.metrics
    assert m["rollout/consecutive_branch_mean"] == pytest.approx(1.5)
    assert [m[f"rollout/consecutive_branch_share/{b}"] for b in ("l0", "l1", "l2", "l3plus")] == [0.25] * 4


def test_previous_segment_prompt_round_penalty(tiny_tokenizer):
    """Same draws, release counter c per prompt: round 3 uses c = 2 for every candidate."""
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(3))
    result = run_rollout(engine, prompts(tiny_tokenizer), tools(), cfg(penalty_scope="prompt_round"),
                         rng=ScriptedUniforms([0.9, 0.2, 0.9, 0.52, 0.7]))
    t0, t1, t2, t3 = result.groups[0]
    assert t0.rounds[1].branch_probability == pytest.approx(0.19)   # c = 1
    assert t1.rounds[1].branch_probability == pytest.approx(0.855)  # c = 1
    assert t0.rounds[2].branch_probability == pytest.approx(0.468)  # c = 2: .52·.9 < .5
    assert t1.rounds[2].branch_probability == pytest.approx(0.63)   # c = 2: .7·.9 → T3
    assert [t.parent_id for t in (t0, t1, t2, t3)] == [None, 0, 1, 1]
    assert result.metrics["rollout/consecutive_branch_max"] == 3


def test_prompt_round_counter_resets_for_prompts_without_gain(tiny_tokenizer):
    """Two prompts: only p0 gains in round 1, so p1's c stays 0 while p0's becomes 1."""
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(2))
    result = run_rollout(engine, prompts(tiny_tokenizer, 2), tools(), cfg(n=3, penalty_scope="prompt_round"),
                         rng=ScriptedUniforms([0.9, 0.3, 0.6, 0.6]))
    g0, g1 = result.groups
    assert g0[0].rounds[0].branch_probability == pytest.approx(0.9)
    assert g1[0].rounds[0].branch_probability == pytest.approx(0.3)
    assert g0[0].rounds[1].branch_probability == pytest.approx(0.6 * 0.95)  # c = 1
    assert g1[0].rounds[1].branch_probability == pytest.approx(0.6)         # c = 0
    assert [len(g) for g in result.groups] == [3, 3]


def test_latest_segment_forks_at_the_tool_result(tiny_tokenizer):
    """Paper default: the decision after result k uses the reaction to result k; the child resumes there."""
    entropies = {0: 1.0, 1: 3.0, 2: 1.0, 3: 1.0}
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(3, lambda s: entropies[s.rounds]))
    c = cfg(n=2, mode="arpo", entropy_segment="latest")
    result = run_rollout(engine, prompts(tiny_tokenizer), tools(), c, rng=ScriptedUniforms([0.45, 0.1, 0.1, 0.1]))
    t0, t1 = result.groups[0]
    k = [min(20, sum(t0.loss_mask[r.start:r.end])) for r in t0.rounds[:2]]  # K of the root and the reaction
    delta = (3.0 * k[1] - 1.0 * k[0]) / math.log(len(tiny_tokenizer))  # sums on the release's scale (§1.2)
    assert t0.rounds[0].branch_probability == pytest.approx(0.45 + 0.2 * delta)
    assert result.metrics["rollout/entropy_leverage"] == 1.0  # U = .45 alone would not have branched
    assert t1.parent_id == 0 and t1.fork_token_index == t0.rounds[0].end
    assert t1.response_token_ids[:t1.fork_token_index] == t0.response_token_ids[:t1.fork_token_index]
    assert len(t1.rounds) == 4 and t1.rounds[1].start == t1.fork_token_index
    assert engine.forks == 1  # the shadow became T1; a full prompt gets no more shadows
    from rich.console import Console

    from aepo_rl.rollout.cli import group_tree

    console = Console(record=True, width=250)
    console.print(group_tree(result.groups[0], 1, "latest"))
    p = 0.45 + 0.2 * delta
    assert (f"T1 forked from T0 after round 1's tool result (token {t1.fork_token_index}, "
            f"H={t0.rounds[1].step_entropy:.3f}, P={p:.3f})") \
        in console.export_text()
    assert all(sid in engine.released for sid in engine.seqs)


def test_slot_persistent_baseline_survives_calls(tiny_tokenizer):
    c = cfg(n=2, mode="arpo", entropy_baseline="slot_persistent", entropy_reduce="mean")
    ln_v = math.log(len(tiny_tokenizer))
    state = tree.RolloutState()
    run_rollout(FakeEngine(tiny_tokenizer, calls_then_answer(1, 2.0)), prompts(tiny_tokenizer), tools(), c, state=state,
                rng=ScriptedUniforms([0.0, 0.0]))
    resumed = tree.RolloutState()  # a checkpoint round trip keeps them too
    resumed.load_state_dict(state.state_dict())
    assert resumed == state and state.slot_baselines and set(state.slot_baselines.values()) == {2.0 / ln_v}
    result = run_rollout(FakeEngine(tiny_tokenizer, calls_then_answer(1, 5.0)), prompts(tiny_tokenizer), tools(), c,
                         state=resumed, rng=ScriptedUniforms([0.0, 0.0]))
    # slot 0's baseline is still the first call's 2.0, not this trajectory's own 5.0
    assert result.groups[0][0].rounds[0].branch_probability == pytest.approx(0.2 * 3.0 / ln_v)
    # without a state to carry over, the call starts from empty baselines: ΔH = 0
    fresh = run_rollout(FakeEngine(tiny_tokenizer, calls_then_answer(1, 5.0)), prompts(tiny_tokenizer), tools(), c,
                        rng=ScriptedUniforms([0.0, 0.0]))
    assert fresh.groups[0][0].rounds[0].branch_probability == 0.0


def test_restarts_fill_the_budget_one_at_a_time(tiny_tokenizer):
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(0))
    result = run_rollout(engine, prompts(tiny_tokenizer), tools(), cfg(n=3))
    assert [t.parent_id for t in result.groups[0]] == [None, None, None]
    assert [len(b) for b in engine.batches] == [1, 1, 1] and result.global_samples == [1]
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(0))
    run_rollout(engine, prompts(tiny_tokenizer), tools(), cfg(n=3, restarts=False))
    assert [len(b) for b in engine.batches] == [1, 2]


@pytest.mark.parametrize("mode", ["aepo", "arpo", "independent"])
@pytest.mark.parametrize("segment", ["latest", "previous"])
def test_exactly_n_per_prompt_and_lineage(tiny_tokenizer, mode, segment):
    for seed in range(4):
        engine = FakeEngine(tiny_tokenizer, calls_then_answer(3, lambda s: 0.5 + s.rounds))
        c = cfg(n=5, mode=mode, global_samples=None, premonitor=True, entropy_segment=segment, branch_factor=2)
        result = run_rollout(engine, prompts(tiny_tokenizer, 3), tools(), c, seed=seed)
        assert len(result.groups) == 3
        for group in result.groups:
            assert [t.traj_id for t in group] == list(range(5))
            for t in group:
                assert t.finish_reason == "answer"
                if t.parent_id is not None:
                    parent = group[t.parent_id]
                    assert t.parent_id < t.traj_id
                    assert t.response_token_ids[:t.fork_token_index] == parent.response_token_ids[:t.fork_token_index]
                    assert t.loss_mask[t.fork_token_index - 1] == 0  # forks sit right after a tool result
            assert len(subtree_roots(group)) == 5
        # one generate call per round for every active sequence of every prompt
        assert all(len(set(b)) == len(b) for b in engine.batches)


def test_validation_is_greedy_single_no_branching(tiny_tokenizer):
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(2))
    result = run_rollout(engine, prompts(tiny_tokenizer, 2), tools(), cfg(n=8), validation=True)
    assert [len(g) for g in result.groups] == [1, 1]
    assert all(p.greedy for p in engine.params) and engine.forks == 0
    assert "</search>" in engine.params[0].stop and "</answer>" in engine.params[0].stop


def test_loss_mask_and_result_block(tiny_tokenizer):
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(1))
    t = run_rollout(engine, prompts(tiny_tokenizer), tools(), cfg(mode="independent", n=1)).groups[0][0]
    assert t.response_text == "<search>q0</search> <result>\nfound q0\n</result><answer>\\boxed{x}</answer>"
    first = t.rounds[0]
    model_len = len(tiny_tokenizer.encode("<search>q0</search>", add_special_tokens=False))
    assert t.loss_mask == [1] * model_len + [0] * (first.end - model_len) + [1] * (len(t.loss_mask) - first.end)
    assert tiny_tokenizer.decode([i for i, m in zip(t.response_token_ids, t.loss_mask) if m == 0]) == \
        " <result>\nfound q0\n</result>"
    assert all(lp == 0.0 and e == 0.0 for lp, e, m in zip(t.logprobs, t.entropies, t.loss_mask) if m == 0)
    assert t.tool_calls[0].result == "found q0" and t.num_tool_calls == 1


def test_call_limit_stops_without_executing(tiny_tokenizer):
    search = EchoSearch()
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(10))
    c = cfg(mode="independent", n=1, call_limit=2)
    t = run_rollout(engine, prompts(tiny_tokenizer), {"search": search}, c).groups[0][0]
    assert search.calls == ["q0", "q1"] and t.num_tool_calls == 2
    assert t.finish_reason == "call_limit" and len(t.rounds) == 3


def test_response_budget_counts_tool_tokens(tiny_tokenizer):
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(10))
    c = cfg(mode="independent", n=1, max_response_length=40, max_tool_response_tokens=3)
    t = run_rollout(engine, prompts(tiny_tokenizer), tools(), c).groups[0][0]
    assert len(t.response_token_ids) == 40 and t.finish_reason == "length"
    body = tiny_tokenizer.encode("found q0", add_special_tokens=False)[:3]
    assert t.tool_calls[0].result == "found q0"
    prefix = tiny_tokenizer.encode(" <result>\n", add_special_tokens=False)
    start = len(tiny_tokenizer.encode("<search>q0</search>", add_special_tokens=False))
    assert t.response_token_ids[start + len(prefix):start + len(prefix) + 3] == body


def test_call_closing_at_the_budget_is_not_executed(tiny_tokenizer):
    search = EchoSearch()
    budget = len(tiny_tokenizer.encode("<search>q0</search>", add_special_tokens=False))
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(1))
    c = cfg(mode="independent", n=1, max_response_length=budget)
    t = run_rollout(engine, prompts(tiny_tokenizer), {"search": search}, c).groups[0][0]
    assert t.finish_reason == "length" and search.calls == [] and len(t.response_token_ids) == budget


@pytest.mark.parametrize("text, reason", [("<search> </search>", "empty_call"), ("oops</search>", "empty_call"),
                                          ("<search>abc<|im_end|>", "eos"), ("<search>abc", "no_call")])
def test_empty_and_unclosed_tags_end_the_trajectory(tiny_tokenizer, text, reason):
    search = EchoSearch()
    engine = FakeEngine(tiny_tokenizer, lambda seq: (text, 1.0))
    t = run_rollout(engine, prompts(tiny_tokenizer), {"search": search}, cfg(mode="independent", n=1)).groups[0][0]
    assert t.finish_reason == reason and search.calls == [] and t.num_tool_calls == 0


def test_tool_error_and_timeout_continue(tiny_tokenizer):
    blocking = BlockingTool()
    blocking.name = blocking.tag = "python"
    tools_ = {"search": RaisingTool(), "python": blocking}

    def script(s):
        return (["<search>a</search>", "<python>x</python>", "<answer>y</answer>"][s.rounds], 1.0)

    c = cfg(mode="independent", n=1, tool_timeout=0.2)
    result = run_rollout(FakeEngine(tiny_tokenizer, script), prompts(tiny_tokenizer), tools_, c)
    blocking.gate.set()
    t = result.groups[0][0]
    assert [call.error for call in t.tool_calls] == [True, True]
    assert t.tool_calls[0].result == "Error: tool 'search' failed: RuntimeError: index missing"
    assert t.tool_calls[1].result == "Error: tool 'python' timed out after 0.2 s."
    assert t.finish_reason == "answer" and result.metrics["rollout/tool_errors"] == 2


def test_identical_calls_are_cached(tiny_tokenizer):
    search = EchoSearch()

    def script(s):
        return ("<search>same</search>" if s.rounds < 2 else "<answer>y</answer>", 1.0)

    run_rollout(FakeEngine(tiny_tokenizer, script), prompts(tiny_tokenizer, 2), {"search": search},
                cfg(mode="independent", n=3))
    assert search.calls == ["same"]


def test_hermes_garbled_json_continues(tiny_tokenizer):
    def script(s):
        return (['<tool_call>{"name": "search", "arguments": {"query": "a"</tool_call>',
                 '<tool_call>{"name": "search", "arguments": {"query": "b"}}</tool_call>',
                 "<answer>y</answer>"][s.rounds], 1.0)

    search = EchoSearch()
    c = cfg(mode="independent", n=1, tool_format="hermes")
    t = run_rollout(FakeEngine(tiny_tokenizer, script), prompts(tiny_tokenizer), {"search": search}, c).groups[0][0]
    assert t.tool_calls[0].error and t.tool_calls[0].result.startswith("Error: the tool call is not valid JSON")
    assert search.calls == ["b"] and t.finish_reason == "answer"
    block = "<|im_start|>user\n<tool_response>\nfound b\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert block in t.response_text


def test_metrics(tiny_tokenizer):
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(1, lambda s: 2.0 if s.rounds == 0 else 4.0))
    result = run_rollout(engine, prompts(tiny_tokenizer), tools(), cfg(mode="independent", n=2, entropy_reduce="mean"))
    m = result.metrics
    assert m["rollout/global_samples"] == 2 and m["rollout/branches_per_prompt"] == 0
    assert m["rollout/branch_decisions"] == 0 and m["rollout/entropy_leverage"] == 0
    assert m["rollout/consecutive_branch_mean"] == 0 and m["rollout/consecutive_branch_share/l0"] == 0
    assert m["rollout/largest_subtree_share"] == 0.5
    ln_v = math.log(len(tiny_tokenizer))
    assert m["rollout/entropy_root"] == pytest.approx(2.0 / ln_v)
    assert m["rollout/entropy_after_tool"] == pytest.approx(4.0 / ln_v)
    assert m["tool_call_counts/mean"] == 1 and m["num_turns/mean"] == 2
    t = result.groups[0][0]
    assert m["response_length/mean"] == len(t.response_token_ids)
    assert m["rollout/decode_tokens"] == 2 * sum(t.loss_mask)


def test_cli_writes_records_and_prints_the_tree(tiny_tokenizer, tmp_path):
    import json

    from rich.console import Console

    from aepo_rl.rollout.cli import print_rollout, write_rollouts

    result = run_rollout(FakeEngine(tiny_tokenizer, calls_then_answer(3)), prompts(tiny_tokenizer), tools(),
                         cfg(entropy_reduce="mean"), rng=ScriptedUniforms([0.9, 0.2, 0.9, 0.52]))
    h = 1.0 / math.log(len(tiny_tokenizer))
    write_rollouts(result.groups, tmp_path / "rollouts.jsonl")
    records = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["traj_id"], r["parent_id"]) for r in records] == [(0, None), (1, 0), (2, 1), (3, 0)]
    assert records[3]["fork_token_index"] == result.groups[0][0].rounds[2].end
    assert records[0]["num_tool_calls"] == 3 and records[0]["step_entropies"] == [h] * 4
    console = Console(record=True, width=250)
    print_rollout(result, console, "previous")
    text = console.export_text()
    assert "prompt p0: 4 trajectories = 1 global samples + 0 restarts + 3 forks" in text
    assert "T0 global sample" in text
    assert (f"T2 forked from T1 after round 2's tool result (token {records[2]['fork_token_index']}, "
            f"H={h:.3f}, P=0.855)") in text
    assert "T3 forked from T0 after round 3's tool result" in text and "P=0.520)" in text
    assert "search('q0')" in text and "rollout/largest_subtree_share" in text


def test_prompt_length_is_checked(tiny_tokenizer):
    engine = FakeEngine(tiny_tokenizer, calls_then_answer(0))
    with pytest.raises(ValueError, match=r"prompt 'p0' has \d+ tokens; it needs 1 to rollout.max_prompt_length=2"):
        run_rollout(engine, prompts(tiny_tokenizer), tools(), cfg(max_prompt_length=2))


def test_premonitoring_reads_the_release_scale_whatever_the_reduction(tiny_tokenizer):
    """§1.3: H_root and H_tool_avg are sums over k tokens / ln|V| under both reductions;
    rollout.entropy_reduce changes ΔH only (with the mean, H_root − H_tool_avg would be K times
    smaller and m would sit at n/2)."""
    script = calls_then_answer(2, lambda s: 3.0 if s.rounds == 0 else 0.2)
    ms = {}
    for reduce in ("sum", "mean"):
        c = cfg(n=12, global_samples=None, premonitor=True, mode="aepo", branch_threshold=1.0, entropy_weight=0.0,
                entropy_reduce=reduce)
        ms[reduce] = run_rollout(FakeEngine(tiny_tokenizer, script), prompts(tiny_tokenizer), tools(), c,
                                 seed=0).metrics["rollout/global_samples"]
    # probe and round 0: "<search>q0</search>" at 3.0 nats a token; after the tool results (paper formula):
    # "<search>q1</search>" and the answer at 0.2.
    length = [len(tiny_tokenizer.encode(t, add_special_tokens=False))
              for t in ("<search>q0</search>", "<search>q1</search>", "<answer>\\boxed{x}</answer>")]
    ln_v = math.log(len(tiny_tokenizer))
    h_root, h_tool = 3.0 * min(20, length[0]) / ln_v, 0.2 * (min(20, length[1]) + min(20, length[2])) / 2 / ln_v
    assert ms["sum"] == ms["mean"] == premonitor_global_samples(12, h_root, h_tool, formula="paper", beta=0.5) > 6
