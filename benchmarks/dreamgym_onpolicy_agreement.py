"""How often is a policy's synthetic success a real one? (a fidelity measurement, not a timing)

DreamGym trains the policy on rewards the experience model predicts. `labmod.dreamgym.fidelity` measures those
predictions on held-out transitions of gold and random policies; this script measures them where training
uses them, on the policy's own episodes: the experience model of `nbs/experiments/dreamgym_table1.ipynb`
(its CPU defaults: TWX *coin*, 12 offline tasks x gold/random/explore, 6 epochs, w/o reasoning, k=1 retrieval,
history) and, per seed, the tiny policy after that notebook's warm start (SFT on random valid actions of 16
tasks). `onpolicy_agreement` plays the policy in the `SyntheticEnv` on the RL training tasks and replays each
episode's actions in the real env. Prints per seed and pooled: synthetic and real success of the same action
sequences, precision (share of synthetic successes that are real) and recall.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dreamgym_onpolicy_agreement.py [--seeds 0 1 2] [--episodes 4]
"""
import argparse
import torch
from labmod.agent import Agent
from labmod.envs.core import list_tasks, make_env
from labmod.experience_data import RuleTeacher, annotate, collect_offline_transitions
from labmod.dreamgym import AbstractStateEnv, agreement_stats, fit_experience_model, onpolicy_agreement
from labmod.models import load_lm
from labmod.train import random_trajectories, sft_examples
from labmod import rl

ENV = "textworld_express"


def fmt(x): return "-" if x is None else f"{x:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--episodes", type=int, default=4, help="synthetic episodes per training task")
    ap.add_argument("--max-turns", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    pool, dev = list_tasks(ENV, "train", games=["coin"]), list_tasks(ENV, "dev", games=["coin"])
    sft_tasks, offline_tasks, train_tasks, fid_tasks = pool[:16], pool[16:28], pool[16:48], dev[16:24]
    def transitions(tasks, policies):
        return annotate(collect_offline_transitions(ENV, tasks, policies=policies, steps=10, progress=False), RuleTeacher(), progress=False)
    em, f = fit_experience_model(transitions(offline_tasks, ("gold", "random", "explore")), transitions(fid_tasks, ("gold", "random")),
                                 epochs=6, lr=3e-3, k=1, with_reasoning=False, with_history=True, max_new_tokens=128, encoder="hashing")
    print(f"experience model: held-out parse {f['em_ok']:.3f}, next-state similarity {f['next_state_similarity']:.3f}, "
          f"reward accuracy {f['reward_accuracy']:.3f}")
    pooled = {"both": 0, "synthetic_only": 0, "real_only": 0, "neither": 0}
    for seed in a.seeds:
        torch.manual_seed(seed)
        agent = Agent(load_lm("tiny", backend="hf", seed=seed), max_new_tokens=16, temperature=1.0, history_k=0)
        env = AbstractStateEnv(make_env(ENV), ENV)
        try: demos = random_trajectories(agent, env, sft_tasks, a.max_turns, seed=seed)
        finally: env.close()
        rl.sft(agent.lm.model, agent.lm.tokenizer, sft_examples(agent, demos), epochs=4, lr=1e-3, seed=seed, progress=False)
        agent.lm.sync_weights()
        r = onpolicy_agreement(em, agent, lambda: make_env(ENV), train_tasks, episodes_per_task=a.episodes, max_turns=a.max_turns,
                               env_name=ENV, seed=seed)
        for k in pooled: pooled[k] += r[k]
        print(f"seed {seed}: {r['n']} episodes; synthetic success {r['synthetic_success']:.3f}, real success of the same actions "
              f"{r['real_success']:.3f}; both {r['both']}, synthetic only {r['synthetic_only']}, real only {r['real_only']}, "
              f"neither {r['neither']}; precision {fmt(r['precision'])}, recall {fmt(r['recall'])}")
    p = agreement_stats(pooled)
    print(f"pooled over {len(a.seeds)} seeds, {p['n']} episodes: synthetic success {fmt(p['synthetic_success'])}, "
          f"real {fmt(p['real_success'])}, precision {fmt(p['precision'])}, recall {fmt(p['recall'])}, agreement {fmt(p['agreement'])}")


if __name__ == "__main__":
    main()
