"""TRL trains on a labmod env: `trl.GRPOTrainer` with labmod's rollout engine as its `rollout_func` (labmod.rl.trl).

The tiny model first gets a short warm start (SFT on the env expert's first two moves of 8 coin games, in the
conversation format the episodes use), so that it writes well-formed actions and sometimes takes the coin; untrained,
every reply is malformed and the env is never stepped. Then two GRPO steps through TRL on other coin games, each step
three tasks x four episodes of up to three turns. The test checks that TRL ran both steps on what the rollout_func
returned, that every episode was played in the real env (a fresh TextWorld-Express env replays its actions to the same
observations and rewards, and the rewards TRL logged are those episodes' rewards), and that the weights moved.
"""
import math
import os

import pytest
import torch

from labmod.agent import Agent
from labmod.envs.core import list_tasks, make_env
from labmod.models import load_lm
from labmod.rl.config import WarmStart
from labmod.rl.run import demonstrations
from labmod.rl.trainer import sft
from labmod.rl.trl import TRLRollout, env_reward, trl_sequence
from labmod.rollout import RolloutConfig

trl = pytest.importorskip("trl")
pytestmark = pytest.mark.timeout(600)
PENALTY = 0.1


def twx():
    return make_env("textworld_express")


def replay(env, traj):
    "Play the episode's env actions in `env`; (first observation, [(observation, env reward) per env step])."
    first, steps = env.reset(traj.task).text, []
    for t in traj.turns:
        if t.action is not None:
            st = env.step(t.action)
            steps.append((st.obs.text, st.reward))
    return first, steps


def recorded(traj):
    "The episode's own record of the same: the env's reward of a turn is its reward less the agent's format penalty."
    steps = [(t.obs.text, t.reward + (0.0 if t.info["valid_format"] else PENALTY)) for t in traj.turns if t.action is not None]
    return traj.initial_obs.text, steps


class Recording(TRLRollout):
    "The rollout_func, keeping each call's episodes and outputs for the checks (it plays exactly as TRLRollout)."
    calls: list

    def __call__(self, prompts, trainer):
        out = super().__call__(prompts, trainer)
        self.calls.append((list(prompts), list(self.trajectories), out, trainer.state.global_step))
        return out


def test_grpo_trainer_trains_the_tiny_model_on_twx_coin(tmp_path):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    pool = list_tasks("textworld_express", "train", games=["coin"], n_per_game=20)
    warm_tasks, train_tasks = pool[:8], pool[8:]
    lm = load_lm("tiny", seed=0)
    with Recording(Agent(lm, max_new_tokens=16, format_penalty=PENALTY), twx, train_tasks,
                   RolloutConfig(max_turns=3, n_envs=4, seed=0)) as ro:
        ro.calls = []
        demos = demonstrations(ro.agent, twx, warm_tasks, source="expert", max_turns=3, n_envs=2)
        warm = sft(lm.model, lm.tokenizer, [(t.prompt_ids, t.completion_ids) for d in demos for t in d.turns[:2]],
                   WarmStart(epochs=6, lr=2e-3, batch_size=2), progress=False)
        assert warm["loss"][-1] < warm["loss"][0] / 3, warm["loss"]
        before = {n: p.detach().clone() for n, p in lm.model.named_parameters()}

        args = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, per_device_train_batch_size=12,
                              num_generations=4, max_steps=2, learning_rate=1e-3, temperature=1.0, beta=0.0,
                              gradient_checkpointing=False, logging_steps=1, report_to="none", save_strategy="no", seed=0)
        trainer = trl.GRPOTrainer(model=lm.model, reward_funcs=env_reward, args=args, train_dataset=ro.dataset(),
                                  processing_class=lm.tokenizer, rollout_func=ro)
        trainer.train()

        # TRL ran two optimizer steps, one rollout_func call before each, on groups of 4 entries of one task
        assert trainer.state.global_step == 2 and [c[3] for c in ro.calls] == [0, 1]
        logs = [h for h in trainer.state.log_history if "loss" in h]
        assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
        for prompts, trajs, out, _ in ro.calls:
            assert len(prompts) == 12 and all(len(set(prompts[i:i + 4])) == 1 for i in range(0, 12, 4))
            assert ro.lost_episodes == 0 and [t.task.id for t in trajs] == prompts
            assert out["env_reward"] == [t.total_reward for t in trajs] and out["env_success"] == [t.success for t in trajs]
            assert out["completion_ids"] == [trl_sequence(t, lm.tokenizer)["completion_ids"] for t in trajs]

        # the episodes are the real env's: a fresh env replays their actions to the same observations and rewards
        trajs = [t for c in ro.calls for t in c[1]]
        env = twx()
        try:
            for t in trajs:
                (first, steps), (first_rec, steps_rec) = replay(env, t), recorded(t)
                assert first == first_rec and [o for o, _ in steps] == [o for o, _ in steps_rec], t.task.id
                assert [r for _, r in steps] == pytest.approx([r for _, r in steps_rec], abs=1e-9), t.task.id
        finally: env.close()
        stepped = [x for t in trajs for x in t.turns if x.action is not None]
        assert stepped and any(x.info["valid"] for x in stepped), "the warm-started policy should play admissible actions"
        # and what TRL logged is what those episodes earned
        for h, (_, ts, _, _) in zip(logs, ro.calls):
            assert h["rewards/env_reward/mean"] == pytest.approx(sum(t.total_reward for t in ts) / len(ts), abs=1e-6)
            assert h["env/success"] == pytest.approx(sum(t.success for t in ts) / len(ts), abs=1e-6)

        changed = sum(not torch.equal(p.detach(), before[n]) for n, p in lm.model.named_parameters())
        print(f"warm-start loss {warm['loss'][0]:.2f} -> {warm['loss'][-1]:.2f}; TRL steps: "
              + "; ".join(f"reward {h['rewards/env_reward/mean']:.3f}, success {h['env/success']:.2f}, loss {h['loss']:.4f}, "
                          f"zero-std groups {h['frac_reward_zero_std']:.2f}" for h in logs)
              + f"; {changed}/{len(before)} weight tensors changed")
        assert changed > len(before) // 2, "TRL's two updates should move the policy's weights"
