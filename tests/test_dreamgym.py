"DreamGym end to end on real TextWorld-Express with real tiny models: experience-model SFT, SyntheticEnv under the one training run, fidelity, real-interaction counts, loud backend failures."
import dataclasses, http.server, json, os, threading
import pytest
import torch

from labmod.agent import Agent
from labmod.envs.core import list_tasks, make_env
from labmod.models import load_lm
from labmod.rl.config import GRPOConfig, RunConfig, WarmStart
from labmod.rl.run import RunTasks, warm_start
from labmod.rollout import RolloutConfig, RolloutEngine
from labmod.dreamgym.data import EMPrompt, EMQuery, RuleTeacher, annotate, collect_offline_transitions, em_sft_examples
from labmod.dreamgym.experience import (EMGeneration, EMTrainConfig, ExperienceModel, ExperienceModelError, SyntheticEnv,
                                        cache_initial_states, tiny_experience_lm, train_experience_model)
from labmod.dreamgym.curriculum import CurriculumConfig
from labmod.dreamgym.train import (AbstractStateEnv, CountingEnv, DreamGymConfig, InteractionCounter, PolicySpec, fresh_policy,
                                   S2RBudget, row_config, train_policy)
from labmod.dreamgym.fidelity import EMConfig, fidelity, fit_experience_model, multi_step_divergence, onpolicy_agreement, transition_judge
from labmod.dreamgym.replay import ReplayBuffer, get_encoder

ENV = "textworld_express"
PLAIN = EMPrompt(k=1, with_reasoning=False, with_history=False)


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


def _run(**kw) -> RunConfig:
    "A toy-size run: no dynamic sampling, evaluation only before and after."
    return RunConfig(**{"dynamic_sampling": False, "eval_every": 0, "progress": False, **kw})


def test_experience_model_sft_reports_and_lowers_both_terms(data):
    torch.manual_seed(0)
    lm = tiny_experience_lm()
    r = train_experience_model(lm, data["train"], data["buf"], EMPrompt(k=1, with_history=False), EMTrainConfig(epochs=3, lr=3e-3, progress=False),
                               eval_transitions=data["held"][:4])
    assert len(r["loss_reasoning"]) == len(r["loss_outcome"]) == 3
    assert r["loss_reasoning"][-1] < r["loss_reasoning"][0] and r["loss_outcome"][-1] < r["loss_outcome"][0]
    # held-out NLL of both terms also falls (before training vs after the last epoch)
    assert r["eval_loss_reasoning"][-1] < r["eval_loss_reasoning"][0] and r["eval_loss_outcome"][-1] < r["eval_loss_outcome"][0]
    assert r["loss_reasoning"][0] != r["loss_outcome"][0]          # two separate terms, not one number twice
    plain = train_experience_model(tiny_experience_lm(), data["train"][:4], data["buf"], EMPrompt(k=1, with_reasoning=False),
                                   EMTrainConfig(epochs=1, progress=False))
    assert plain["loss_reasoning"] == [None] and plain["loss_outcome"][0] > 0


def test_a_trained_model_is_asked_in_the_format_it_was_trained_on(data):
    cfg = EMConfig(prompt=EMPrompt(k=2, with_reasoning=True, history_keep=2), train=EMTrainConfig(epochs=1, progress=False),
                   gen=EMGeneration(max_new_tokens=8, retries=0))
    em, _ = fit_experience_model(data["train"], data["held"][:2], cfg)
    assert em.prompt is cfg.prompt
    deep = [t for t in data["train"] if len(t.history) > cfg.prompt.history_keep]
    assert deep
    for t in deep[:3] + data["train"][:2]:
        (trained_on,) = em_sft_examples([t], em.buffer, cfg.prompt)
        assert em.messages([EMQuery.of(t)]) == [trained_on.messages]
    # a synthetic episode's first step asks what the SFT example of the real first step was trained on
    real = make_env(ENV)
    try: inits = cache_initial_states(real, data["train_tasks"][:1])
    finally: real.close()
    first = next(t for t in data["train"] if t.task_id == data["train_tasks"][0].id and not t.history)
    env = SyntheticEnv(em, ENV, inits)
    env.reset(data["train_tasks"][0])
    q = env.query(first.action)
    assert em.messages([q]) == [em_sft_examples([first], em.buffer, cfg.prompt, exclude_same_task=False)[0].messages]


def test_malformed_answers_are_marked_not_raised(data):
    em = ExperienceModel(tiny_experience_lm(), data["buf"], EMPrompt(k=1), EMGeneration(max_new_tokens=4, retries=1))   # 4 tokens cannot hold the format
    outs = em.predict_many([EMQuery.of(t) for t in data["held"][:3]])
    assert all(not o.ok and o.error for o in outs)
    assert em.stats["failed"] == 3 and em.stats["retried"] == 3 and em.stats["errors"] == 0
    inits = {t.id: {"state": "Location: kitchen", "valid_actions": ["look around"]} for t in data["train_tasks"]}
    env = SyntheticEnv(em, ENV, inits)
    env.reset(data["train_tasks"][0])
    st = env.step("look around")
    assert st.info["synthetic"] and st.info["em_ok"] is False and st.info["em_error"]
    assert st.obs.text == "Location: kitchen" and st.reward == 0.0 and not st.done


class _ModelServer(http.server.BaseHTTPRequestHandler):
    "An OpenAI-compatible chat-completions endpoint serving a real local model (as a vLLM server would); stop strings left out."
    lm = None

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        g = type(self).lm.chat([body["messages"]], max_new_tokens=body["max_tokens"], temperature=body["temperature"],
                               stop=body.get("stop"))[0]
        text = g.text
        for s in body.get("stop") or []:
            if s in text: text, reason = text[:text.index(s)], "stop"; break
        else: reason = g.finish_reason
        data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}]}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)

    def log_message(self, *a): pass


def test_the_experience_model_serves_over_an_endpoint_and_a_dead_one_is_loud(data):
    torch.manual_seed(0)
    local = tiny_experience_lm()
    train_experience_model(local, data["train"], data["buf"], PLAIN, EMTrainConfig(epochs=16, lr=3e-3, batch_size=4, progress=False))
    _ModelServer.lm = local
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ModelServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        remote = load_lm("em", backend="openai", base_url=f"http://127.0.0.1:{srv.server_address[1]}/v1", logprobs=False, max_workers=1)
        gen = EMGeneration(max_new_tokens=128, retries=0)
        q = [EMQuery.of(t) for t in data["held"][:8]]   # 8, not 3: a fresh-clone run had none of 3 greedy answers parse (the tiny model)
        mine, theirs = ExperienceModel(local, data["buf"], PLAIN, gen), ExperienceModel(remote, data["buf"], PLAIN, gen)
        here = [mine.predict_many([x])[0] for x in q]     # one at a time, as the endpoint serves them: the same greedy answers
        there = theirs.predict_many(q)
        assert [o.ok for o in here] == [o.ok for o in there] and any(o.ok for o in here)   # greedy: the same answers, read the same way
        assert [o.next_state for o in here] == [o.next_state for o in there]
    finally: srv.shutdown(); srv.server_close()
    # nobody serves this endpoint: every synthetic step raises instead of paying reward 0, and the run stops, counted
    dead = ExperienceModel(load_lm("em", backend="openai", base_url="http://127.0.0.1:9/v1"), data["buf"], PLAIN)
    env = SyntheticEnv(dead, ENV, {t.id: {"state": "Location: kitchen"} for t in data["train_tasks"]})
    env.reset(data["train_tasks"][0])
    with pytest.raises(ExperienceModelError, match="openai_base_url"):
        env.step("look around")
    assert dead.stats["errors"] == 1 and dead.stats["failed"] == 0
    agent = _warm_policy(data, seed=4)   # writes well-formed actions, so its synthetic episodes take steps
    cfg = DreamGymConfig(run=_run(steps=1, groups_per_step=1, group_size=2, max_turns=2, n_envs=2), mode="dreamgym")
    # the engine retries (then loses) an episode whose env raised; the run's hooks raise after the collection
    with pytest.raises(ExperienceModelError, match="queries failed"):
        train_policy(agent, lambda: make_env(ENV), RunTasks(data["train_tasks"][:1], data["held_tasks"][:1]), cfg, em=dead)
    assert dead.stats["errors"] > 1 and dead.stats["generations"] == 0


def _warm_policy(data, seed=1):
    "The small tiny-recipe policy after a short SFT on real expert demos, so that it writes well-formed actions."
    agent = Agent(tiny_experience_lm(seed=seed), max_new_tokens=12, temperature=0.5)
    warm_start(agent, lambda: make_env(ENV), data["train_tasks"][1:3], WarmStart("expert", epochs=10, lr=2e-3), max_turns=2, progress=False)
    return agent


def test_synthetic_env_under_rollout_engine_and_grpo(data):
    torch.manual_seed(0)
    em = ExperienceModel(tiny_experience_lm(), data["buf"], PLAIN, EMGeneration(max_new_tokens=24, retries=0))
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
    # GRPO through the one training run: synthetic env for training, real env for evaluation; enrichment on
    cfg = DreamGymConfig(run=_run(steps=1, groups_per_step=2, group_size=2, max_turns=2, n_envs=2, algo=GRPOConfig(lr=1e-3)), enrich=True)
    q0, n0 = em.stats["queries"], len(em.buffer)
    res = train_policy(agent, lambda: make_env(ENV), RunTasks(data["train_tasks"][:2], data["held_tasks"][:1]), cfg, em=em)
    hist = res["phases"]["synthetic"]["history"]
    assert len(hist) == 1 and hist[0]["trajectories"] == 4 and hist[0]["step"] == 1 and not hist[0].get("skipped_update")
    assert res["em_stats"]["queries"] > q0                                  # the training episodes were stepped by the experience model
    ri = res["real_interactions"]
    assert ri.get("train_steps", 0) == 0 and ri["train_resets"] == 2       # only the initial-state cache touched the real env for training
    assert ri["eval_resets"] == 2                                           # evaluation before and after, in the real env, counted apart
    added = res["phases"]["synthetic"]["hooks"]["enriched"]
    assert len(em.buffer) == n0 + added and all(t.source == "synthetic" for t in em.buffer.transitions[n0:])
    assert added == sum(1 for t in em.buffer.transitions[n0:]) and (added == 0 or em.buffer.transitions[-1].env == ENV)


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
    em = ExperienceModel(tiny_experience_lm(), data["buf"], PLAIN, EMGeneration(max_new_tokens=16, retries=0))
    agent = _warm_policy(data, seed=2)
    cfg = DreamGymConfig(run=_run(steps=1, groups_per_step=1, group_size=2, max_turns=2, n_envs=1, algo=GRPOConfig(lr=1e-4)),
                         mode="dreamgym_s2r", s2r=S2RBudget(1))
    res = train_policy(agent, lambda: make_env(ENV), RunTasks(data["train_tasks"][:1], data["held_tasks"][:1]), cfg, em=em)
    s2r_turns = sum(r["turns_mean"] * r["trajectories"] for r in res["phases"]["s2r"]["history"])
    assert set(res["phases"]) == {"synthetic", "s2r"}
    # every real training step happened in the S2R phase, at most one per recorded turn (malformed turns never reach the env)
    assert 0 <= res["real_train_steps"] <= s2r_turns and res["real_interactions"]["train_resets"] == 1 + 2


def test_grpo_and_ppo_rows_are_evaluated_the_same_way(data):
    "The two updates of a Table-1 row share the run: the same held-out episodes, at the same temperature, give the same first reading."
    recipe = DreamGymConfig(run=_run(steps=1, groups_per_step=1, group_size=2, max_turns=2, n_envs=2, rollout_mode="sync",
                                     eval_temperature=None, eval_samples=2, warm=WarmStart("expert", epochs=2, lr=2e-3),
                                     algo=GRPOConfig(lr=1e-4, old_logprobs="sampler")))
    tasks = RunTasks(data["train_tasks"][:1], data["held_tasks"][:2], warm=data["train_tasks"][1:3])
    res = {}
    for algo in ("grpo", "ppo"):
        agent = fresh_policy(PolicySpec("tiny-em", temperature=0.5, max_new_tokens=12), seed=0)
        res[algo] = train_policy(agent, lambda: make_env(ENV), tasks, row_config(recipe, "real", algo, seed=0))
    g, p, n = res["grpo"], res["ppo"], 2 * 2
    assert (g["algo"], p["algo"]) == ("grpo", "ppo")
    assert g["before"]["episodes"] == g["after"]["episodes"] == p["before"]["episodes"] == p["after"]["episodes"] == n
    assert g["real_interactions"]["eval_resets"] == p["real_interactions"]["eval_resets"] == 2 * n
    assert g["before"] == p["before"]   # same warm start, same episodes, same sampling temperature and seeds: the same reading


class _VariationWriter:
    "A deterministic stand-in for the generator LM's answer (the tiny LM writes no usable variations)."
    name = "variation-writer"
    def chat(self, batch, **kw):
        from labmod.models import Generation
        return [Generation("1. Find the coin, then open the fridge in the kitchen.\n2. Take the coin and walk back to the start.",
                           [], [], [], "stop") for _ in batch]


def test_curriculum_variations_train_in_the_synthetic_env_only(data):
    em = ExperienceModel(tiny_experience_lm(), data["buf"], PLAIN, EMGeneration(max_new_tokens=16, retries=0))
    agent = _warm_policy(data, seed=3)
    run = _run(steps=2, groups_per_step=2, group_size=2, max_turns=2, n_envs=2, algo=GRPOConfig(lr=1e-4))
    with pytest.raises(ValueError, match="synthetic env"):
        DreamGymConfig(run=run, mode="real", curriculum=CurriculumConfig())
    cfg = DreamGymConfig(run=run, curriculum=CurriculumConfig(lam=0.5, seeds_per_round=2, min_var=0.0))
    res = train_policy(agent, lambda: make_env(ENV), RunTasks(data["train_tasks"][:2], data["held_tasks"][:1]), cfg, em=em,
                       variation_lm=_VariationWriter())
    cur = res["curriculum"]
    assert [r["synthetic_groups_played"] for r in cur.rounds] == [0, 1]       # λ = 0.5 of 2 groups once the pool has tasks
    # round 1 varies both real tasks (2 each); round 2 sees one real task (already varied: duplicates dropped) and one
    # synthetic task, varied again (one of the two answers repeats its own instruction and is rejected)
    assert [r["accepted"] for r in cur.rounds] == [4, 1] and len(cur.synthetic) == 5
    real_ids = {x.id for x in data["train_tasks"]}
    assert sum(t.metadata["parent"] in real_ids for t in cur.synthetic) == 4
    assert all(t.metadata["parent"] in real_ids or t.metadata["parent"] in {x.id for x in cur.synthetic} for t in cur.synthetic)
    assert res["phases"]["synthetic"]["hooks"]["curriculum"]["synthetic_tasks"] == 5
    ri = res["real_interactions"]
    assert ri.get("train_steps", 0) == 0 and ri["train_resets"] == 2           # variations never touched the real env


def test_fidelity_on_held_out_real_transitions(data):
    torch.manual_seed(0)
    # room descriptions are ~60-100 tokens: 128 new tokens fit the whole answer
    gen = EMGeneration(max_new_tokens=128, retries=0)
    untrained = ExperienceModel(tiny_experience_lm(), data["buf"], PLAIN, gen)
    lm = tiny_experience_lm()
    train_experience_model(lm, data["train"], data["buf"], PLAIN, EMTrainConfig(epochs=16, lr=3e-3, batch_size=4, progress=False))
    trained = ExperienceModel(lm, data["buf"], PLAIN, gen)
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
        assert "LABMOD_JUDGE_MODEL" in transition_judge(trained, data["held"][:1])["skipped"]


def test_onpolicy_agreement_replays_the_policys_synthetic_episodes_in_the_real_env(data):
    from labmod.dreamgym.fidelity import AgreementConfig
    torch.manual_seed(0)
    # an untrained experience model never answers in format: its episodes never succeed, whatever the real env says
    em = ExperienceModel(tiny_experience_lm(), data["buf"], PLAIN, EMGeneration(max_new_tokens=16, retries=0))
    agent = _warm_policy(data)
    a = onpolicy_agreement(em, agent, lambda: make_env(ENV), data["train_tasks"][:2], AgreementConfig(episodes_per_task=2, max_turns=3))
    assert a["n"] == 4 and a["skipped"] == 0 and a["lost"] == 0 and a["both"] + a["synthetic_only"] + a["real_only"] + a["neither"] == 4
    assert a["synthetic_success"] == 0.0 and a["precision"] is None and a["both"] == 0
    assert em.stats["queries"] > 0
    assert a["agreement"] == 1 - a["real_success"]
