"""How often is a policy's synthetic success a real one? (a fidelity measurement, not a timing)

DreamGym trains the policy on rewards the experience model predicts. `labmod.dreamgym.train.fidelity` measures those
predictions on held-out transitions of gold and random policies; this script measures them where training
uses them, on the policy's own episodes: the experience model of `nbs/experiments/dreamgym_table1.ipynb`
(its CPU defaults: TWX *coin*, 32 offline tasks x gold/random/explore, 8 epochs, w/o reasoning, k=1 retrieval,
history; `--offline-tasks 12 --em-epochs 6` is the recipe before 2026-11-30's session 6) and, per seed, the tiny
policy after that notebook's warm start (SFT on random valid actions of 16 tasks). `warm_policy_agreement`
plays the policy in the `SyntheticEnv` on the RL training tasks and replays each episode's actions in the real
env. Prints per seed and pooled: synthetic and real success of the same action sequences, precision (share of
synthetic successes that are real) and recall. The notebook reports the same table; this script varies the
experience model's data without running the policy rows; `--reward-gate` turns on `SyntheticEnv`'s reward gate
(rewards for actions the real env does not list in that state are not paid).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dreamgym_onpolicy_agreement.py [--seeds 0 1 2] [--episodes 4] [--offline-tasks 32] [--em-epochs 8] [--reward-gate]
"""
import argparse
import torch
from labmod.envs.core import list_tasks
from labmod.dreamgym.data import RuleTeacher, annotate, collect_offline_transitions
from labmod.dreamgym.train import agreement_stats, fit_experience_model, warm_policy_agreement

ENV = "textworld_express"


def fmt(x): return "-" if x is None else f"{x:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--episodes", type=int, default=4, help="synthetic episodes per training task")
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--offline-tasks", type=int, default=32, help="training tasks whose gold/random/explore episodes train the experience model")
    ap.add_argument("--em-epochs", type=int, default=8)
    ap.add_argument("--reward-gate", action="store_true", help="SyntheticEnv(gate_rewards=True)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    pool, dev = list_tasks(ENV, "train", games=["coin"]), list_tasks(ENV, "dev", games=["coin"])
    sft_tasks, offline_tasks, train_tasks, fid_tasks = pool[:16], pool[16:16 + a.offline_tasks], pool[16:48], dev[16:24]
    def transitions(tasks, policies):
        return annotate(collect_offline_transitions(ENV, tasks, policies=policies, steps=10, progress=False), RuleTeacher(), progress=False)
    em, f = fit_experience_model(transitions(offline_tasks, ("gold", "random", "explore")), transitions(fid_tasks, ("gold", "random")),
                                 epochs=a.em_epochs, lr=3e-3, k=1, with_reasoning=False, with_history=True, max_new_tokens=128, encoder="hashing")
    print(f"experience model ({f['n_offline']} offline transitions, {a.em_epochs} epochs): held-out parse {f['em_ok']:.3f}, "
          f"next-state similarity {f['next_state_similarity']:.3f}, reward accuracy {f['reward_accuracy']:.3f}")
    pooled = {"both": 0, "synthetic_only": 0, "real_only": 0, "neither": 0}
    for seed in a.seeds:
        r = warm_policy_agreement(em, ENV, train_tasks, sft_tasks, seed, max_turns=a.max_turns, episodes_per_task=a.episodes,
                                  reward_gate=a.reward_gate)
        for k in pooled: pooled[k] += r[k]
        print(f"seed {seed}: {r['n']} episodes; synthetic success {r['synthetic_success']:.3f}, real success of the same actions "
              f"{r['real_success']:.3f}; both {r['both']}, synthetic only {r['synthetic_only']}, real only {r['real_only']}, "
              f"neither {r['neither']}; precision {fmt(r['precision'])}, recall {fmt(r['recall'])}")
    p = agreement_stats(pooled)
    print(f"reward gate {'on' if a.reward_gate else 'off'}; pooled over {len(a.seeds)} seeds, {p['n']} episodes: synthetic success {fmt(p['synthetic_success'])}, "
          f"real {fmt(p['real_success'])}, precision {fmt(p['precision'])}, recall {fmt(p['recall'])}, agreement {fmt(p['agreement'])}")


if __name__ == "__main__":
    main()
