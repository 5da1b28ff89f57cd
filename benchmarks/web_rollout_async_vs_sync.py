"""Async vs lockstep (sync) web rollouts on the served documentation sites in real Chromium (WebGym's
asynchronous rollout system, here on this machine's CPUs).

The policy is the embedded tiny model after a short warm start on the scripted expert's navigation (click) turns
(so its actions are well-formed and reach the browser). Both modes get the same resources, measured side by side
in one process: `--n-envs` browser slots (in-thread, or process-isolated with `--pooled`), one LM batch of at most
`--n-envs` prompts, the same rubric evaluation queue; the modes alternate `--repeats` times so machine noise hits
both. Prints episodes/s of each mode (best of the repeats), policy and browser utilization, and the speedup.

    .venv/bin/python benchmarks/web_rollout_async_vs_sync.py [--episodes 16] [--n-envs 4] [--pooled]
"""
import argparse, os
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
from labmod.agent import Agent, TASK_FORMAT
from labmod.models import load_lm
from labmod.rl import RunConfig, WarmStart, warm_start
from labmod.webgym.rubric import generate_tasks
from labmod.webgym.websites import DEFAULT_SITES, installed_sites, serve_sites
from labmod.webgym.train import WebGymConfig, web_envs, click_turns_only, rollout_throughput

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--n-envs", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--step-limit", type=int, default=4)
    ap.add_argument("--sft-tasks", type=int, default=3)
    ap.add_argument("--sft-epochs", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pooled", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    names = installed_sites(DEFAULT_SITES)
    sites = serve_sites(names)
    tasks = generate_tasks(names, tasks_per_site=max(2, args.episodes // len(names) + 1), seed=0, max_pages=25)
    sft_tasks, tasks = tasks[:args.sft_tasks], (tasks[args.sft_tasks:] * 4)[:args.episodes]
    agent = Agent(load_lm("tiny", seed=0), format=TASK_FORMAT, history_k=0, max_new_tokens=16)
    # click turns only: their completions are short; the reference answers (~130 tokens) are beyond a short warm start
    with web_envs(sites, WebGymConfig()) as factory:
        sft = warm_start(agent, factory, sft_tasks, WarmStart(epochs=args.sft_epochs, lr=2e-3, batch_size=1), args.max_turns,
                         progress=False, edit=click_turns_only)
    print(f"warm start on {sft['examples']} expert click turns: loss {sft['loss'][0]:.2f} -> {sft['loss'][-1]:.2f} in {sft['time']:.0f}s")
    cfg = WebGymConfig(run=RunConfig(max_turns=args.max_turns, n_envs=args.n_envs, seed=1, progress=False), step_limit=args.step_limit,
                       pooled=args.pooled)
    res = rollout_throughput(agent, sites, tasks, cfg, repeats=args.repeats)
    print(f"sites={names} episodes={len(tasks)} n_envs={args.n_envs} pooled={args.pooled} torch_threads={args.threads}")
    for m, st in res.items():
        print(f"{m:5s}: {st['episodes_per_s']:.3f} episodes/s (runs {[round(x, 3) for x in st['runs']]})  wall {st['wall_s']:.1f}s  "
              f"turns {st['turns']}  invalid {st['invalid_format']}  policy_util {st['policy_utilization']:.2f}  "
              f"env_util {st['env_utilization']:.2f}  mean_batch {st['mean_batch']:.2f}  score_wait {st['score_wait_s']:.3f}s")
    print(f"speedup = {res['async']['episodes_per_s'] / res['sync']['episodes_per_s']:.2f}x")

if __name__ == "__main__":
    main()
