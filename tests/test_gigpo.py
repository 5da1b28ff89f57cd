"""GiGPO (Feng et al. 2025): the episode advantage A_E plus step advantages A_S from groups of turns that acted on
the same anchor state, against a hand-computed example; singleton anchors and step_weight 0 reduce it to GRPO; and
`train(...)` with a `GiGPOConfig` updates the tiny policy on TextWorld-Express coin."""
import math

import pytest

from labmod.core import Observation, Task, Trajectory, Turn
from labmod.rl import GiGPOConfig, gigpo_samples, samples_from_groups, step_advantages

EPS = 1e-4   # group_advantages adds it to the std


def walk(first: str, steps: list[tuple[str, float]], task: str = "t") -> Trajectory:
    "A real trajectory starting at observation `first`; each step is (observation after the turn, its reward)."
    tr = Trajectory(Task(task, "toy"), Observation(first))
    for k, (obs, r) in enumerate(steps):
        tr.turns.append(Turn(f"prompt {k}", completion=f"action {k}", action=f"action {k}", prompt_ids=[10, 11, k],
                             completion_ids=[20 + k, 2], logprobs=[-0.7, -0.1], obs=Observation(obs), reward=r, done=k == len(steps) - 1))
    return tr


def example_group() -> list[Trajectory]:
    # all start at S0; A and B both act at S1; B (its 3rd turn) and C (its 2nd) both act at S3; C's 3rd turn is alone at S4
    A = walk("S0", [("S1", 0.0), ("S2", 1.0)])
    B = walk("S0", [("S1", 0.0), ("S3", 0.0), ("S2", 1.0)])
    C = walk("S0", [("S3", 0.0), ("S4", 0.0), ("S5", 0.0)])
    return [A, B, C]


def test_hand_computed_example():
    cfg = GiGPOConfig(gamma=0.5)   # step_weight 1, step_scale and scale_rewards on (verl-agent's mean_std_norm)
    s = gigpo_samples([example_group()], cfg)
    # discounted returns, gamma 0.5: A [0 + 0.5*1, 1] = [0.5, 1]; B [0.25, 0.5, 1]; C [0, 0, 0]
    # step group S0: returns (A0, B0, C0) = (0.5, 0.25, 0): mean 0.25, unbiased std sqrt((0.0625 + 0 + 0.0625) / 2) = 0.25
    a_s0 = [0.25 / (0.25 + EPS), 0.0, -0.25 / (0.25 + EPS)]
    # step group S1: (A1, B1) = (1, 0.5): mean 0.75, std sqrt((0.0625 + 0.0625) / 1) = sqrt(0.125)
    a_s1 = [0.25 / (math.sqrt(0.125) + EPS), -0.25 / (math.sqrt(0.125) + EPS)]
    # step group S3: (B2, C1) = (1, 0): mean 0.5, std sqrt(0.25 + 0.25) = sqrt(0.5); step group S4: C2 alone: 0
    a_s3 = [0.5 / (math.sqrt(0.5) + EPS), -0.5 / (math.sqrt(0.5) + EPS)]
    # episode rewards (1, 1, 0): mean 2/3, std sqrt((1/9 + 1/9 + 4/9) / 2) = sqrt(1/3)
    sd = math.sqrt(1 / 3) + EPS
    a_e = [(1 / 3) / sd, (1 / 3) / sd, -(2 / 3) / sd]
    # turn weight (turn_weight="episode"): 1/2 for A's turns, 1/3 for B's and C's; advantage = w * (A_E + 1 * A_S)
    expected = [(a_e[0] + a_s0[0]) / 2, (a_e[0] + a_s1[0]) / 2,
                (a_e[1] + a_s0[1]) / 3, (a_e[1] + a_s1[1]) / 3, (a_e[1] + a_s3[0]) / 3,
                (a_e[2] + a_s0[2]) / 3, (a_e[2] + a_s3[1]) / 3, (a_e[2] + 0.0) / 3]
    # the same numbers written out: 0.7884, 0.6421, 0.1924, -0.0432, 0.4281, -0.7180, -0.6205, -0.3848
    assert [round(x, 4) for x in expected] == [0.7884, 0.6421, 0.1924, -0.0432, 0.4281, -0.7180, -0.6205, -0.3848]
    assert [x.advantage for x in s] == pytest.approx(expected, abs=1e-12)
    assert [x.meta["step_group"] for x in s] == [3, 2, 3, 2, 2, 3, 2, 1]
    assert [x.input_ids for x in s[:2]] == [[10, 11, 0, 20, 2], [10, 11, 1, 21, 2]] and s[0].loss_mask == [0, 0, 0, 1, 1]

    # mean_norm (no std) and no turn weight: advantage = A_E + 2 * A_S with the plain differences from the means
    s = gigpo_samples([example_group()], GiGPOConfig(gamma=0.5, step_weight=2.0, scale_rewards=False, step_scale=False, turn_weight="none"))
    e = [1 / 3, 1 / 3, -2 / 3]
    expected = [e[0] + 2 * 0.25, e[0] + 2 * 0.25, e[1] + 2 * 0.0, e[1] - 2 * 0.25, e[1] + 2 * 0.5, e[2] - 2 * 0.25, e[2] - 2 * 0.5, e[2]]
    assert [x.advantage for x in s] == pytest.approx(expected, abs=1e-12)


def test_anchor_is_the_state_acted_on():
    # an invalid-format turn (its obs stays the state it acted on) leaves the next turn at the same anchor
    tr = walk("S0", [("S0", 0.0), ("S1", 1.0)])
    other = walk("S0", [("S2", 0.0)])
    _, sizes = step_advantages([[tr, other]], gamma=1.0)
    assert sizes == [[[3, 3], [3]]]          # both of tr's turns and other's turn act at S0
    # keyed by prompt ids instead, the three turns (prompts [10, 11, 0], [10, 11, 1], [10, 11, 0]) form groups of 2 and 1
    _, sizes = step_advantages([[tr, other]], gamma=1.0, anchor="prompt")
    assert sizes == [[[2, 1], [2]]]
    with pytest.raises(ValueError, match="anchor"): step_advantages([[tr]], anchor="state")
    with pytest.raises(ValueError, match="sample_mode"): GiGPOConfig(sample_mode="episode")


def test_singletons_and_zero_step_weight_are_grpo():
    # every trajectory starts somewhere else: every step group is a singleton, A_S = 0, GiGPO = GRPO at any step_weight
    g = [walk(f"start {i}", [(f"room {i}-{k}", float(k == 1 and i < 2)) for k in range(2 + i)]) for i in range(3)]
    st, sizes = step_advantages([g], gamma=0.9)
    assert all(n == 1 for t in sizes[0] for n in t) and all(a == 0.0 for t in st[0] for a in t)
    for tw in ("episode", "none"):
        grpo = [x.advantage for x in samples_from_groups([g], "step", turn_weight=tw)]
        assert any(grpo) and [x.advantage for x in gigpo_samples([g], GiGPOConfig(step_weight=3.0, turn_weight=tw))] == grpo
    # step_weight 0 on the example with shared anchors: exactly GRPO's step-mode samples, under either turn weighting
    for tw in ("episode", "none"):
        grpo = samples_from_groups([example_group()], "step", turn_weight=tw)
        zero = gigpo_samples([example_group()], GiGPOConfig(step_weight=0.0, turn_weight=tw))
        assert [x.advantage for x in zero] == [x.advantage for x in grpo] and [x.input_ids for x in zero] == [x.input_ids for x in grpo]
        # and with the step term on, the turns that share a state are ranked inside it (B's detour from S1 is blamed)
        full = gigpo_samples([example_group()], GiGPOConfig(gamma=0.5, turn_weight=tw))
        assert grpo[3].advantage > 0 > full[3].advantage


def test_train_runs_gigpo_on_twx_coin():
    import torch
    from labmod.agent import Agent
    from labmod.envs.core import list_tasks, make_env
    from labmod.models import load_lm
    from labmod.rl import RunConfig, RunHooks, RunTasks, WarmStart, train, warm_start
    from labmod.rl.run import snapshot_weights

    class Keep(RunHooks):
        "Keeps the groups the run trained on."
        def __init__(self): self.seen = []
        def groups(self, tasks, groups): self.seen += groups; return groups

    pool = list_tasks("textworld_express", split="train", games=["coin"])
    make = lambda: make_env("textworld_express")
    agent = Agent(load_lm("tiny", seed=0), max_new_tokens=16, temperature=1.0, history_k=0)
    # SFT on the expert's 2-3 step solutions of 8 tasks: the policy then succeeds on about 1 episode in 5 at
    # temperature 1 (5 of 24 measured), so about half the groups of 4 have unequal rewards
    warm_start(agent, make, pool[:8], WarmStart(source="expert", epochs=8), 4, 0, progress=False)
    before = snapshot_weights(agent.lm)
    hooks = Keep()
    cfg = RunConfig(steps=2, groups_per_step=2, group_size=4, max_turns=4, n_envs=4, eval_every=0, eval_temperature=1.0,
                    max_gen_batches=3, seed=0, progress=False,
                    algo=GiGPOConfig(lr=5e-4, old_logprobs="sampler", micro_batch_size=16))
    res = train(agent, make, RunTasks(pool[8:40], list_tasks("textworld_express", split="dev", games=["coin"])[:4]), cfg, hooks)
    assert len(res["history"]) == 2 and res["effective_updates"] >= 1, res["history"]
    after = agent.lm.model.state_dict()
    moved = max(float((after[k].float() - v.float()).abs().max()) for k, v in before.items())
    assert moved > 0, "no weight moved in 2 GiGPO updates"
    # the groups it trained on had step groups with more than one turn (at least the shared first state) and a
    # step advantage that is not zero there (an informative group's first turns have different returns)
    s = gigpo_samples(hooks.seen, cfg.algo)
    assert max(x.meta["step_group"] for x in s) >= cfg.group_size
    assert any(abs(x.meta["step_advantage"]) > 1e-6 for x in s)
    assert torch.isfinite(torch.tensor([x.advantage for x in s])).all()
    # and the run logged the step groups of every update that trained
    trained = [h for h in res["history"] if not h.get("skipped_update")]
    assert trained and all(h["gigpo/step_group_mean"] > 1 and 0 < h["gigpo/shared_turns"] <= 1 for h in trained), trained
