"""How often is a policy's synthetic success a real one, with and without the reward gate? (a fidelity measurement, not a timing)

DreamGym trains the policy on rewards the experience model predicts. `labmod.dreamgym.fidelity.fidelity` measures those
predictions on held-out transitions of gold and random policies; this script measures them where training
uses them, on the policy's own episodes: the experience model of `nbs/experiments/dreamgym_table1.ipynb`
(its CPU defaults: TWX *coin*, 32 offline tasks x gold/random/explore, 8 epochs, w/o reasoning, k=1 retrieval,
history; `--offline-tasks 12 --em-epochs 6` is the recipe before 2026-11-30's session 6) and, per seed, the tiny
policy after that notebook's warm start (SFT on random valid actions of 16 tasks). `warm_policy_agreement` plays
the policy in the `SyntheticEnv` on the RL training tasks and replays each episode's actions in the real env.
Each seed runs twice side by side, the same experience model and the same warm-started policy: the paper's ungated
`SyntheticEnv`, and with the lab's reward gate (rewards for actions the real env does not list in that state are
not paid). Prints per seed and pooled: synthetic and real success of the same action sequences, precision (share
of synthetic successes that are real) and recall, and the ratio of the two precisions.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dreamgym_onpolicy_agreement.py [--seeds 0 1 2] [--episodes 4] [--offline-tasks 32] [--em-epochs 8]
"""
import argparse
import torch
from labmod.envs.core import list_tasks
from labmod.rl.config import RunConfig, WarmStart
from labmod.rl.run import RunTasks
from labmod.dreamgym.data import EMPrompt, RuleTeacher, annotate, collect_offline_transitions
from labmod.dreamgym.experience import EMGeneration, EMTrainConfig
from labmod.dreamgym.fidelity import EMConfig, agreement_stats, fit_experience_model, warm_policy_agreement
from labmod.dreamgym.train import DreamGymConfig, PolicySpec

ENV = "textworld_express"
COUNTS = ("both", "synthetic_only", "real_only", "neither")


def fmt(x): return "-" if x is None else f"{x:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--episodes", type=int, default=4, help="synthetic episodes per training task")
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--offline-tasks", type=int, default=32, help="training tasks whose gold/random/explore episodes train the experience model")
    ap.add_argument("--em-epochs", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(1)
    pool, dev = list_tasks(ENV, "train", games=["coin"]), list_tasks(ENV, "dev", games=["coin"])
    sft_tasks, offline_tasks, train_tasks, eval_tasks, fid_tasks = pool[:16], pool[16:16 + a.offline_tasks], pool[16:48], dev[:16], dev[16:24]
    def transitions(tasks, policies):
        return annotate(collect_offline_transitions(ENV, tasks, policies=policies, steps=10, progress=False), RuleTeacher(), progress=False)
    cfg = EMConfig(prompt=EMPrompt(k=1, with_reasoning=False, with_history=True), train=EMTrainConfig(epochs=a.em_epochs, lr=3e-3, progress=False),
                   gen=EMGeneration(max_new_tokens=128, retries=1), encoder="hashing")
    em, f = fit_experience_model(transitions(offline_tasks, ("gold", "random", "explore")), transitions(fid_tasks, ("gold", "random")), cfg)
    print(f"experience model ({f['n_offline']} offline transitions, {a.em_epochs} epochs): held-out parse {f['em_ok']:.3f}, "
          f"next-state similarity {f['next_state_similarity']:.3f}, reward accuracy {f['reward_accuracy']:.3f}")
    tasks = RunTasks(train_tasks, eval_tasks, warm=sft_tasks)
    pooled = {gate: dict.fromkeys(COUNTS, 0) for gate in (False, True)}
    for seed in a.seeds:
        run = RunConfig(max_turns=a.max_turns, seed=seed, warm=WarmStart("random", epochs=4, lr=1e-3))
        for gate in (False, True):
            r = warm_policy_agreement(em, tasks, DreamGymConfig(run=run, reward_gate=gate), PolicySpec(), episodes_per_task=a.episodes)
            for k in COUNTS: pooled[gate][k] += r[k]
            print(f"seed {seed}, reward gate {'on ' if gate else 'off'}: {r['n']} episodes; synthetic success {fmt(r['synthetic_success'])}, "
                  f"real success of the same actions {fmt(r['real_success'])}; both {r['both']}, synthetic only {r['synthetic_only']}, "
                  f"real only {r['real_only']}, neither {r['neither']}; precision {fmt(r['precision'])}, recall {fmt(r['recall'])}", flush=True)
    p = {gate: agreement_stats(c) for gate, c in pooled.items()}
    for gate in (False, True):
        q = p[gate]
        print(f"reward gate {'on ' if gate else 'off'}, pooled over {len(a.seeds)} seeds, {q['n']} episodes: synthetic success "
              f"{fmt(q['synthetic_success'])}, real {fmt(q['real_success'])}, precision {fmt(q['precision'])}, recall {fmt(q['recall'])}, "
              f"agreement {fmt(q['agreement'])}")
    off, on = p[False]["precision"], p[True]["precision"]
    print(f"precision gated / ungated: {fmt(on / off if off and on is not None else None)}")


if __name__ == "__main__":
    main()
