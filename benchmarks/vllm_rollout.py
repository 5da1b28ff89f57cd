"""Rollouts with the vLLM backend vs the HF backend, and vLLM's prefix-cache reuse across the turns of an episode.

`RolloutEngine` runs an `Agent` on SmolLM2-135M-Instruct over TextWorld-Express *coin* episodes, once with
`load_lm(model, backend="hf")` (generation by labmod's sampler on the transformers module) and once with
`backend="vllm"` (the in-process vLLM engine): the same tasks, rollout seed, `max_new_tokens`, `n_envs`, history
window and turn limit. Before each timed run the engine runs a few warm-up episodes on other (dev) tasks, so env start
and the first slow calls are outside the timing; the vLLM prefix cache is reset afterwards, so the hits counted are the
timed run's own.

Prints episodes/s and new tokens/s of each backend and `speedup = vllm/hf episodes/s` (want >= 1.5; also per CPU second
of this process, which the load of a shared machine disturbs less; the envs' JVM is not counted), then, for the vLLM
run, the prefix-cache hit rate (`vllm:prefix_cache_hits / vllm:prefix_cache_queries`, prompt tokens, from
`LLM.get_metrics()`) and, from the trajectories, how much of each later turn's prompt the previous turn's prompt +
completion already holds (the longest common token prefix, and that prefix cut to whole KV blocks: the most a
prefix cache could reuse from the previous turn).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vllm_rollout.py [--episodes 16] [--n-envs 8] [--max-turns 5]
"""
import argparse, os, time


def prefix_cache_counters(llm) -> dict:
    "vLLM's cumulative prefix-cache counters (prompt tokens looked up, tokens found cached)."
    return {m.name: m.value for m in llm.get_metrics() if m.name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")}


def turn_prefix_reuse(groups, block: int) -> dict:
    "Over turns 2.. of every episode: prompt tokens, and those shared with the previous turn's prompt + completion."
    total = shared = whole_blocks = 0
    for g in groups:
        for t in g:
            for prev, cur in zip(t.turns, t.turns[1:]):
                before, now = prev.prompt_ids + prev.completion_ids, cur.prompt_ids
                n = next((i for i, (a, b) in enumerate(zip(before, now)) if a != b), min(len(before), len(now)))
                total, shared, whole_blocks = total + len(now), shared + n, whole_blocks + n // block * block
    return {"prompt_tokens": total, "common_prefix": shared, "common_prefix_whole_blocks": whole_blocks}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=1, help="episodes per task (GRPO groups share their first prompt)")
    ap.add_argument("--n-envs", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--history-k", type=int, default=4, help="past turns in the prompt (4: the whole 5-turn episode)")
    ap.add_argument("--mode", default="async", choices=["async", "sync"])
    ap.add_argument("--warmup", type=int, default=2, help="warm-up episodes (dev tasks) before each timed run")
    args = ap.parse_args()
    from labmod.agent import Agent
    from labmod.envs.core import list_tasks, make_env
    from labmod.models import load_lm
    from labmod.rollout import RolloutConfig, RolloutEngine

    load0 = os.getloadavg()[0]
    tasks = list_tasks("textworld_express", split="train", games=["coin"], n_per_game=-(-args.episodes // args.group_size))
    warm = list_tasks("textworld_express", split="dev", games=["coin"], n_per_game=args.warmup)
    cfg = RolloutConfig(max_turns=args.max_turns, n_envs=args.n_envs, max_batch=args.n_envs, mode=args.mode, seed=1)
    res = {}
    for backend in ("hf", "vllm"):
        lm = load_lm(args.model, backend=backend, seed=0)
        agent = Agent(lm, max_new_tokens=args.max_new_tokens, temperature=1.0, history_k=args.history_k)
        with RolloutEngine(agent, lambda: make_env("textworld_express"), cfg) as eng:
            eng.run(warm, group_size=1)
            if backend == "vllm": lm.engine.reset_prefix_cache(); c0 = prefix_cache_counters(lm.engine)
            t, c = time.perf_counter(), time.process_time()
            groups = eng.run(tasks, group_size=args.group_size)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            st = eng.stats
        turns = [u for g in groups for tr in g for u in tr.turns]
        res[backend] = dict(stats=st, wall=wall, cpu=cpu, groups=groups, new_tokens=sum(len(u.completion_ids) for u in turns),
                            prompt_tokens=sum(len(u.prompt_ids) for u in turns), turns=len(turns),
                            success=sum(tr.success for g in groups for tr in g) / max(1, sum(map(len, groups))))
        if backend == "vllm":
            c1 = prefix_cache_counters(lm.engine)
            res["cache"] = {k: c1[k] - c0.get(k, 0) for k in c1}
            res["block"] = lm.engine.llm_engine.vllm_config.cache_config.block_size
        lm.close(); del lm, agent

    print(f"\n{args.model}, TextWorld-Express coin: {args.episodes} episodes (group size {args.group_size}), n_envs {args.n_envs}, "
          f"max_turns {args.max_turns}, max_new_tokens {args.max_new_tokens}, history_k {args.history_k}, mode {args.mode}; "
          f"load avg {load0:.2f} before, {os.getloadavg()[0]:.2f} after, {os.cpu_count()} cores")
    for b in ("hf", "vllm"):
        r, st = res[b], res[b]["stats"]
        print(f"{b:4s}: {st.episodes} episodes, {r['turns']} turns in {r['wall']:.1f}s (this process's cpu {r['cpu']:.1f}s) -> {st.episodes_per_s:.3f} episodes/s; "
              f"{r['new_tokens']} new tokens ({r['new_tokens'] / r['wall']:.1f}/s), {r['prompt_tokens'] / max(r['turns'], 1):.0f} prompt "
              f"tokens/turn; policy busy {st.policy_busy_s:.1f}s in {st.policy_calls} calls (mean batch {st.mean_batch:.1f}); "
              f"success {r['success']:.2f}")
    h, v = res["hf"]["stats"], res["vllm"]["stats"]
    print(f"speedup = {v.episodes_per_s / h.episodes_per_s:.2f}x episodes/s (vllm/hf; want >= 1.5); "
          f"{(res['vllm']['new_tokens'] / res['vllm']['wall']) / (res['hf']['new_tokens'] / res['hf']['wall']):.2f}x new tokens/s; "
          f"{(v.episodes / res['vllm']['cpu']) / (h.episodes / res['hf']['cpu']):.2f}x episodes per cpu-second of this process")
    c = res["cache"]
    q, hits = c.get("vllm:prefix_cache_queries", 0), c.get("vllm:prefix_cache_hits", 0)
    print(f"vLLM prefix cache (block size {res['block']}): hit rate = {hits / max(q, 1):.3f} ({hits:.0f} of {q:.0f} prompt tokens)")
    reuse = turn_prefix_reuse(res["vllm"]["groups"], res["block"])
    print(f"turns 2..{args.max_turns}: {reuse['common_prefix'] / max(reuse['prompt_tokens'], 1):.3f} of their prompt tokens are a prefix "
          f"of the previous turn's prompt + completion ({reuse['common_prefix_whole_blocks'] / max(reuse['prompt_tokens'], 1):.3f} "
          f"in whole {res['block']}-token blocks)")


if __name__ == "__main__":
    main()
