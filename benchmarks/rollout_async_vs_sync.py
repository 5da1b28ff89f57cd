"""Async vs lockstep (sync) rollouts on real envs, side by side in one run.

Episodes mix ScienceWorld (JVM, ~ms steps, long episodes) and MiniWoB++ in Chromium (~50 ms steps,
short episodes), so episode lengths and step latencies vary. The policy is the embedded tiny model after
a short SFT warm start on expert demonstrations (so its actions are well-formed and reach the envs).

Prints episodes/s for both modes, `speedup` (async / sync), the ideal throughput (the bound set by the
busiest resource: LM seconds per episode on one core vs env seconds per episode spread over the env slots,
both measured in the async run) and `fraction_of_ideal` (async / ideal), with LM and env utilization.

    .venv/bin/python benchmarks/rollout_async_vs_sync.py [--episodes 24] [--n-envs 4]
"""
import argparse, random, time
from labmod.agent import Agent
from labmod.envs.core import RoutingEnv, list_tasks
from labmod.models import load_lm
from labmod.rollout import RolloutEngine, RolloutConfig
from labmod.rl import WarmStart, warm_start

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=24)
    ap.add_argument("--n-envs", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--sw-task", default="find-living-thing")
    args = ap.parse_args()
    rng = random.Random(0)
    sw = [t for t in list_tasks("scienceworld", split="train") if args.sw_task in t.id][:4]
    mw = list_tasks("miniwob", split="train", tasks=["click-button", "enter-text", "click-checkboxes"], seeds_per_task=4)
    tasks = [rng.choice(sw if i % 2 else mw) for i in range(args.episodes)]
    lm = load_lm("tiny")
    agent = Agent(lm, max_new_tokens=24, history_k=1)
    warm_start(agent, RoutingEnv, sw[:2] + mw[:4], WarmStart(source="expert", epochs=3, lr=1e-3), max_turns=args.max_turns, progress=False)
    results = {}
    for mode in ("sync", "async", "sync", "async"):   # interleaved twice: machine noise hits both modes
        with RolloutEngine(agent, RoutingEnv, RolloutConfig(max_turns=args.max_turns, n_envs=args.n_envs, mode=mode,
                                                            max_batch=args.n_envs, seed=1)) as eng:
            eng.run(tasks[:args.n_envs], group_size=1)      # warm the envs (JVM, browser) outside the timing
            eng.run(tasks, group_size=1)
            results.setdefault(mode, []).append(eng.stats)
    best = {m: max(s, key=lambda s: s.episodes_per_s) for m, s in results.items()}
    a, s = best["async"], best["sync"]
    lm_per_ep = a.policy_busy_s / a.episodes
    env_per_ep = a.env_busy_s / a.episodes / args.n_envs
    ideal = 1.0 / max(lm_per_ep, env_per_ep)
    print(f"episodes={args.episodes} n_envs={args.n_envs} turns(async)={a.turns} turns(sync)={s.turns}")
    for m, st in best.items():
        print(f"{m:5s}: {st.episodes_per_s:.3f} episodes/s  wall {st.wall_s:.1f}s  lm_util {st.policy_utilization:.2f}  "
              f"env_util {st.env_utilization:.2f}  mean_batch {st.mean_batch:.2f}")
    print(f"ideal: {ideal:.3f} episodes/s (busiest resource: {'LM' if lm_per_ep >= env_per_ep else 'env workers'}; "
          f"LM {lm_per_ep:.3f} s/episode, env {env_per_ep:.3f} s/episode per slot)")
    print(f"speedup = {a.episodes_per_s / s.episodes_per_s:.2f}x")
    print(f"fraction_of_ideal = {a.episodes_per_s / ideal:.2f}")

if __name__ == "__main__":
    main()
