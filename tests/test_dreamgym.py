"DreamGym end to end on real TextWorld-Express with real tiny models: experience-model SFT, SyntheticEnv under the trainer, fidelity, real-interaction counts."
import os
import pytest
import torch

from labmod.agent import Agent
from labmod.envs.core import list_tasks, make_env
from labmod.dreamgym.experience import (EMQuery, ExperienceModel, SyntheticEnv, cache_initial_states, tiny_experience_lm,
                               train_experience_model)
from labmod.dreamgym.data import RuleTeacher, annotate, collect_offline_transitions
from labmod.dreamgym.train import (AbstractStateEnv, CountingEnv, InteractionCounter, fidelity, llm_judge, multi_step_divergence,
                             onpolicy_agreement, train_policy)
from labmod.dreamgym.replay import ReplayBuffer, get_encoder
from labmod.rollout import RolloutConfig, RolloutEngine
from labmod.rl.run import TaskRLConfig, warm_start
from labmod import rl

ENV = "textworld_express"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # the CI machine has 2 shared cores: two torch threads per process thrash under load (measured 5x slower)
    n = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def data():
    train_tasks = list_tasks(ENV, "train", games=["coin"], n_per_game=3)
    held_tasks = list_tasks(ENV, "dev", games=["coin"], n_per_game=2)
    train = annotate(collect_offline_transitions(ENV, train_tasks, policies=("gold", "random"), steps=5, progress=False),
                     RuleTeacher(), progress=False)
    held = annotate(collect_offline_transitions(ENV, held_tasks, policies=("gold",), steps=5, progress=False), RuleTeacher(), progress=False)
    buf = ReplayBuffer(get_encoder("hashing", dim=512)); buf.add(train)
    return dict(train_tasks=train_tasks, held_tasks=held_tasks, train=train, held=held, buf=buf)


def test_experience_model_sft_reports_and_lowers_both_terms(data):
    torch.manual_seed(0)
    lm = tiny_experience_lm()
    r = train_experience_model(lm, data["train"], data["buf"], epochs=3, lr=3e-3, k=1, with_history=False,
                               eval_transitions=data["held"][:4], progress=False)
    assert len(r["loss_reasoning"]) == len(r["loss_outcome"]) == 3
    assert r["loss_reasoning"][-1] < r["loss_reasoning"][0] and r["loss_outcome"][-1] < r["loss_outcome"][0]
    # held-out NLL of both terms also falls (before training vs after the last epoch)
    assert r["eval_loss_reasoning"][-1] < r["eval_loss_reasoning"][0] and r["eval_loss_outcome"][-1] < r["eval_loss_outcome"][0]
    assert r["loss_reasoning"][0] != r["loss_outcome"][0]          # two separate terms, not one number twice
    plain = train_experience_model(tiny_experience_lm(), data["train"][:4], data["buf"], epochs=1, k=1, with_reasoning=False,
                                   progress=False)
    assert plain["loss_reasoning"] == [None] and plain["loss_outcome"][0] > 0


def test_malformed_answers_are_marked_not_raised(data):
    em = ExperienceModel(tiny_experience_lm(), data["buf"], k=1, max_new_tokens=4, retries=1)   # 4 tokens cannot hold the format
    outs = em.predict_many([EMQuery(t.instruction, t.history, t.state, t.action, t.env) for t in data["held"][:3]])
    assert all(not o.ok and o.error for o in outs)
    assert em.stats["failed"] == 3 and em.stats["retried"] == 3
    inits = {t.id: {"state": "Location: kitchen", "valid_actions": ["look around"]} for t in data["train_tasks"]}
    env = SyntheticEnv(em, ENV, inits)
    env.reset(data["train_tasks"][0])
    st = env.step("look around")
    assert st.info["synthetic"] and st.info["em_ok"] is False and st.info["em_error"]
    assert st.obs.text == "Location: kitchen" and st.reward == 0.0 and not st.done


def _warm_policy(data, seed=1):
    "The small tiny-recipe policy after a short SFT on real expert demos, so that it writes well-formed actions."
    agent = Agent(tiny_experience_lm(seed=seed), max_new_tokens=12, temperature=0.5)
    warm_start(agent, lambda: make_env(ENV), data["train_tasks"][1:3], "expert", epochs=10, lr=2e-3, max_turns=2, progress=False)
    return agent


def test_synthetic_env_under_rollout_engine_and_grpo(data):
    torch.manual_seed(0)
    em = ExperienceModel(tiny_experience_lm(), data["buf"], k=1, with_reasoning=False, with_history=False, max_new_tokens=24, retries=0)
    real = make_env(ENV)
    try: inits = cache_initial_states(real, data["train_tasks"][:2])
    finally: real.close()
    agent = _warm_policy(data)
    with RolloutEngine(agent, lambda: SyntheticEnv(em, ENV, inits, max_steps=2), RolloutConfig(max_turns=2, n_envs=2, seed=0)) as eng:
        groups = eng.run(data["train_tasks"][:2], group_size=2)
    assert [len(g) for g in groups] == [2, 2]
    assert all(t.turns and t.initial_obs.text == inits[t.task.id]["state"] for g in groups for t in g)
    stepped = [tu for g in groups for t in g for tu in t.turns if tu.action is not None]
    assert stepped and all(tu.info["synthetic"] and "em_ok" in tu.info for tu in stepped)
    assert em.stats["queries"] == len(stepped)
    # GRPO through run_task_rl / rl.train_loop, unchanged: synthetic env for training, real env for evaluation
    cfg = TaskRLConfig(steps=1, groups_per_step=2, group_size=2, max_turns=2, n_envs=2, dynamic_sampling=False, eval_every=0,
                       grpo=rl.GRPOConfig(lr=1e-3, seed=0, temperature=agent.temperature))
    q0 = em.stats["queries"]
    res = train_policy("dreamgym", "grpo", agent, lambda: make_env(ENV), data["train_tasks"][:2], data["held_tasks"][:1], cfg,
                       em=em, progress=False)
    hist = res["phases"]["synthetic"]["history"]
    assert len(hist) == 1 and hist[0]["trajectories"] == 4 and hist[0]["step"] == 1 and not hist[0].get("skipped_update")
    assert res["em_stats"]["queries"] > q0                                  # the training episodes were stepped by the experience model
    ri = res["real_interactions"]
    assert ri.get("train_steps", 0) == 0 and ri["train_resets"] == 2       # only the initial-state cache touched the real env for training
    assert ri["eval_resets"] == 2                                           # evaluation before and after, in the real env, counted apart


def test_real_interaction_counter_counts_only_real_steps(data):
    counter = InteractionCounter()
    env = AbstractStateEnv(CountingEnv(make_env(ENV), counter), ENV)
    try:
        o = env.reset(data["train_tasks"][0]); assert o.text.startswith("Location: ")
        path = env.inner.inner.gold_path()[:3]
        for a in path: env.step(a)
        env.reset(data["held_tasks"][0]); env.step("look around")
    finally: env.close()
    assert path and counter.as_dict() == {"train_resets": 1, "train_steps": len(path), "eval_resets": 1, "eval_steps": 1}
    # S2R: the synthetic phase adds no real training steps; the real phase does
    em = ExperienceModel(tiny_experience_lm(), data["buf"], k=1, with_reasoning=False, with_history=False, max_new_tokens=16, retries=0)
    agent = _warm_policy(data, seed=2)
    cfg = TaskRLConfig(steps=1, groups_per_step=1, group_size=2, max_turns=2, n_envs=1, dynamic_sampling=False, eval_every=0,
                       grpo=rl.GRPOConfig(lr=1e-4, seed=0, temperature=agent.temperature))
    res = train_policy("dreamgym_s2r", "grpo", agent, lambda: make_env(ENV), data["train_tasks"][:1], data["held_tasks"][:1], cfg,
                       em=em, s2r_steps=1, progress=False)
    s2r_turns = sum(r["turns_mean"] * r["trajectories"] for r in res["phases"]["s2r"]["history"])
    assert set(res["phases"]) == {"synthetic", "s2r"}
    # every real training step happened in the S2R phase, at most one per recorded turn (malformed turns never reach the env)
    assert 0 <= res["real_train_steps"] <= s2r_turns and res["real_interactions"]["train_resets"] == 1 + 2


class _VariationWriter:
    "A deterministic stand-in for the generator LM's answer (the tiny LM writes no usable variations)."
    name = "variation-writer"
    def chat(self, batch, **kw):
        from labmod.models import Generation
        return [Generation("1. Find the coin, then open the fridge in the kitchen.\n2. Take the coin and walk back to the start.",
                           [], [], [], "stop") for _ in batch]


def test_curriculum_variations_train_in_the_synthetic_env_only(data):
    from labmod.dreamgym.curriculum import Curriculum, TaskVariationGenerator
    em = ExperienceModel(tiny_experience_lm(), data["buf"], k=1, with_reasoning=False, with_history=False, max_new_tokens=16, retries=0)
    agent = _warm_policy(data, seed=3)
    cfg = TaskRLConfig(steps=2, groups_per_step=2, group_size=2, max_turns=2, n_envs=2, dynamic_sampling=False, eval_every=0,
                       grpo=rl.GRPOConfig(lr=1e-4, seed=0, temperature=agent.temperature))
    cur = Curriculum(TaskVariationGenerator(_VariationWriter()), lam=0.5, seeds_per_round=2, min_var=0.0, seed=0)
    with pytest.raises(ValueError, match="synthetic env"):
        train_policy("real", "grpo", agent, lambda: make_env(ENV), data["train_tasks"][:2], data["held_tasks"][:1], cfg, curriculum=cur)
    res = train_policy("dreamgym", "grpo", agent, lambda: make_env(ENV), data["train_tasks"][:2], data["held_tasks"][:1], cfg,
                       em=em, progress=False, curriculum=cur)
    assert [r["synthetic_groups_played"] for r in cur.rounds] == [0, 1]       # λ = 0.5 of 2 groups once the pool has tasks
    # round 1 varies both real tasks (2 each); round 2 sees one real task (already varied: duplicates dropped) and one
    # synthetic task, varied again (one of the two answers repeats its own instruction and is rejected)
    assert [r["accepted"] for r in cur.rounds] == [4, 1] and len(cur.synthetic) == 5
    real_ids = {x.id for x in data["train_tasks"]}
    assert sum(t.metadata["parent"] in real_ids for t in cur.synthetic) == 4
    assert all(t.metadata["parent"] in real_ids or t.metadata["parent"] in {x.id for x in cur.synthetic} for t in cur.synthetic)
    assert res["phases"]["synthetic"]["curriculum"]["synthetic_tasks"] == 5
    ri = res["real_interactions"]
    assert ri.get("train_steps", 0) == 0 and ri["train_resets"] == 2           # variations never touched the real env


def test_fidelity_on_held_out_real_transitions(data):
    torch.manual_seed(0)
    # room descriptions are ~60-100 tokens: 128 new tokens fit the whole answer
    kw = dict(k=1, with_reasoning=False, with_history=False, max_new_tokens=128, retries=0)
    untrained = ExperienceModel(tiny_experience_lm(), data["buf"], **kw)
    lm = tiny_experience_lm()
    train_experience_model(lm, data["train"], data["buf"], epochs=10, lr=3e-3, batch_size=4, k=1, with_reasoning=False, with_history=False,
                           progress=False)
    trained = ExperienceModel(lm, data["buf"], **kw)
    f0, f1 = fidelity(untrained, data["held"]), fidelity(trained, data["held"])
    for f in (f0, f1):
        assert f["n"] == len(data["held"])
        for k in ("em_ok", "next_state_match", "next_state_similarity", "next_state_f1", "reward_accuracy", "done_accuracy"):
            assert 0.0 <= f[k] <= 1.0, (k, f[k])
        assert 0.0 <= f["reward_mae"] <= 1.0
    assert f1["next_state_similarity"] > f0["next_state_similarity"], (f0["next_state_similarity"], f1["next_state_similarity"])
    d = multi_step_divergence(trained, lambda: make_env(ENV), data["held_tasks"][:1], max_steps=2)
    assert 1 <= len(d["mean_similarity_by_step"]) <= 2 and all(0 <= s <= 1 for s in d["mean_similarity_by_step"])
    assert 1 <= d["first_divergence"][0] <= 3
    assert len(d["static_similarity_by_step"]) == len(d["mean_similarity_by_step"])
    # the untrained model never parses (seeded) and a failed step keeps the state: it is exactly the no-change baseline
    assert f0["em_ok"] == 0
    d0 = multi_step_divergence(untrained, lambda: make_env(ENV), data["held_tasks"][:1], max_steps=2)
    assert d0["mean_similarity_by_step"] == d0["static_similarity_by_step"] == d["static_similarity_by_step"]
    assert d0["first_divergence_mean"] == d0["static_first_divergence_mean"]
    if not os.environ.get("LABMOD_JUDGE_MODEL"):
        assert "LABMOD_JUDGE_MODEL" in llm_judge(trained, data["held"][:1])["skipped"]


def test_onpolicy_agreement_replays_the_policys_synthetic_episodes_in_the_real_env(data):
    torch.manual_seed(0)
    # an untrained experience model never answers in format: its episodes never succeed, whatever the real env says
    em = ExperienceModel(tiny_experience_lm(), data["buf"], k=1, with_reasoning=False, with_history=False, max_new_tokens=16, retries=0)
    agent = _warm_policy(data)
    a = onpolicy_agreement(em, agent, lambda: make_env(ENV), data["train_tasks"][:2], episodes_per_task=2, max_turns=3)
    assert a["n"] == 4 and a["skipped"] == 0 and a["both"] + a["synthetic_only"] + a["real_only"] + a["neither"] == 4
    assert a["synthetic_success"] == 0.0 and a["precision"] is None and a["both"] == 0
    assert em.stats["queries"] > 0
    assert a["agreement"] == 1 - a["real_success"]
