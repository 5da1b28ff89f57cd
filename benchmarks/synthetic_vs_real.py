"""Synthetic (DreamGym experience model) vs real env steps/s, side by side, for TextWorld-Express and ScienceWorld.

Two measurements per env, each run for the real env and for a `SyntheticEnv` backed by the tiny experience
model (after a short SFT on real offline transitions of the same env, w/o reasoning, so its answers parse):

1. raw env throughput: `--n-envs` envs stepped concurrently by the rollout engine with random admissible actions
   (`env_steps_per_s`; the real env pays for its abstract-state mapping; the synthetic envs share one experience
   model, whose batcher merges their concurrent steps into one LM batch) -> env steps/s;
2. through the rollout engine: the same agent (the small tiny-recipe model after a short SFT on expert demos,
   so that its actions are well-formed) plays the same tasks against each env, with
   `--n-envs` slots -> env steps/s of the whole rollout (LM decisions included) and the env's share of it.

Prints steps/s for real and synthetic and the ratio synthetic / real. The experience model's generation
length (`--em-tokens`) sets its cost: the paper's point is not that synthetic steps are cheaper than a
fast simulator, but that they stand in for envs that are slow, costly or not available for RL at all.

    .venv/bin/python benchmarks/synthetic_vs_real.py [--envs textworld_express scienceworld] [--steps 24] [--n-envs 4]
"""
import argparse
import torch
from labmod.agent import Agent
from labmod.envs.core import list_tasks, make_env
from labmod.rl.config import WarmStart
from labmod.rl.run import warm_start
from labmod.rollout import RolloutConfig, RolloutEngine
from labmod.dreamgym.data import EMPrompt, collect_offline_transitions
from labmod.dreamgym.experience import (EMGeneration, EMTrainConfig, ExperienceModel, SyntheticEnv, cache_initial_states,
                                        tiny_experience_lm, train_experience_model)
from labmod.dreamgym.fidelity import env_steps_per_s
from labmod.dreamgym.replay import ReplayBuffer, get_encoder
from labmod.dreamgym.train import AbstractStateEnv

TASK_KW = {"textworld_express": {"games": ["coin"]}, "scienceworld": {"tasks": ["find-living-thing"]}}


def tasks_for(env_name, n):
    kw = TASK_KW.get(env_name, {})
    try: ts = list_tasks(env_name, "train", **kw)
    except TypeError: ts = list_tasks(env_name, "train")
    return ts[:n]


def warm_agent(name, tasks, max_turns):
    "The small tiny-recipe policy after a short SFT on the env's expert demos, so that its actions reach the env."
    agent = Agent(tiny_experience_lm(seed=1), max_new_tokens=12, history_k=1, temperature=0.5)
    warm_start(agent, lambda: make_env(name), tasks[:2], WarmStart("expert", epochs=10, lr=2e-3), max_turns=max_turns, progress=False)
    return agent


def engine_steps_per_s(agent, make, tasks, n_envs, max_turns):
    "Env steps/s of a whole rollout (LM decisions included), env seconds per env call, LM seconds per decision."
    with RolloutEngine(agent, make, RolloutConfig(max_turns=max_turns, n_envs=n_envs, max_batch=n_envs, seed=0)) as eng:
        eng.run(tasks[:n_envs], group_size=1)        # start the env slots (JVMs) outside the timing
        groups = eng.run(tasks, group_size=2)
        s = eng.stats
    turns = [tu for g in groups for t in g for tu in t.turns]
    env_steps = sum(1 for tu in turns if tu.action is not None)
    env_calls = env_steps + s.episodes
    # each turn records its share of the policy call that decided it
    policy_s = sum(tu.timings.get("policy_s", 0.0) for tu in turns) / max(len(turns), 1)
    return env_steps / s.wall_s, s.env_busy_s / max(env_calls, 1), policy_s, env_steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", nargs="+", default=["textworld_express", "scienceworld"])
    ap.add_argument("--steps", type=int, default=24, help="raw steps per env thread")
    ap.add_argument("--n-envs", type=int, default=4)
    ap.add_argument("--em-tokens", type=int, default=128, help="room descriptions run to ~115 tokens: fewer cuts them off")
    ap.add_argument("--em-epochs", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (2 threads thrash on a loaded 2-core machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads); torch.manual_seed(0)
    for name in args.envs:
        tasks = tasks_for(name, max(args.n_envs, 4))
        offline = collect_offline_transitions(name, tasks, policies=("gold", "random"), steps=6, progress=False)
        buf = ReplayBuffer(get_encoder("hashing", dim=512)); buf.add(offline)
        lm = tiny_experience_lm()
        prompt = EMPrompt(k=1, with_reasoning=False, with_history=False)
        train_experience_model(lm, offline, buf, prompt, EMTrainConfig(epochs=args.em_epochs, lr=3e-3, progress=False))
        em = ExperienceModel(lm, buf, prompt, EMGeneration(max_new_tokens=args.em_tokens, retries=0, batch_wait_s=0.005, max_batch=args.n_envs))
        real0 = make_env(name)
        try: inits = cache_initial_states(real0, tasks, name)
        finally: real0.close()
        make_syn = lambda: SyntheticEnv(em, name, inits, max_steps=10 ** 6)
        real_raw = env_steps_per_s(lambda: AbstractStateEnv(make_env(name), name), tasks, args.steps, args.n_envs)
        syn_raw = env_steps_per_s(make_syn, tasks, args.steps, args.n_envs)
        print(f"[{name}] raw env steps/s ({args.n_envs} envs at once, random admissible actions): "
              f"real {real_raw:.1f}  synthetic {syn_raw:.1f}  ratio synthetic/real {syn_raw / real_raw:.3f}  "
              f"(em ok {1 - em.stats['failed'] / max(em.stats['queries'], 1):.2f}, mean EM batch "
              f"{em.stats['queries'] / max(em.stats['batches'], 1):.1f})", flush=True)
        agent = warm_agent(name, tasks, args.max_turns)
        r = engine_steps_per_s(agent, lambda: make_env(name), tasks, args.n_envs, args.max_turns)
        s = engine_steps_per_s(agent, make_syn, tasks, args.n_envs, args.max_turns)
        print(f"[{name}] rollout engine env steps/s (tiny agent, {args.n_envs} slots): real {r[0]:.2f}  synthetic {s[0]:.2f}  "
              f"ratio {s[0] / max(r[0], 1e-9):.3f} ({r[3]} / {s[3]} env steps); env s per call real {r[1] * 1e3:.1f} ms "
              f"synthetic {s[1] * 1e3:.1f} ms; agent LM s per decision {r[2] * 1e3:.0f} / {s[2] * 1e3:.0f} ms", flush=True)


if __name__ == "__main__":
    main()
