"""Learning for real: GRPO raises the tiny policy's success on held-out TextWorld-Express tasks.

The warm start is SFT on *random* valid actions, so it teaches the action format and what is admissible
but no strategy: the policy starts near the random-walk success rate (0.19 on these tasks), and anything
above that on the held-out dev fold was learned by GRPO from the env's reward. Success is measured at the
sampling temperature with 3 episodes per held-out task (96 episodes), the quantity GRPO optimizes.
Rollouts are asynchronous, so batch composition (and with it the sampled tokens) varies from run to run
even with a fixed seed: the margin is set against the spread measured over seeds 0-2 (issue 4's note).
"""
from labmod.agent import Agent
from labmod.envs.core import list_tasks, make_env
from labmod.models import load_lm
from labmod.rl import GRPOConfig, RunConfig, RunTasks, WarmStart, train


def test_grpo_raises_held_out_success_on_twx_coin():
    pool = list_tasks("textworld_express", split="train", games=["coin"])
    sft_tasks, train_tasks = pool[:16], pool[16:80]
    eval_tasks = list_tasks("textworld_express", split="dev", games=["coin"])[:32]
    assert not {t.id for t in eval_tasks} & {t.id for t in pool}
    lm = load_lm("tiny", seed=0)
    agent = Agent(lm, max_new_tokens=16, temperature=1.0, history_k=0)
    cfg = RunConfig(steps=4, groups_per_step=8, group_size=8, max_turns=5, n_envs=8, eval_every=0, eval_temperature=1.0,
                    eval_samples=3, seed=0, progress=False, warm=WarmStart(source="random", epochs=4),
                    algo=GRPOConfig(lr=5e-4, old_logprobs="sampler", micro_batch_size=16))
    res = train(agent, lambda: make_env("textworld_express"), RunTasks(train_tasks, {"dev": eval_tasks}, warm=sft_tasks), cfg)
    before, after = res["before"], res["after"]
    print(f"held-out success {before['success']:.3f} -> {after['success']:.3f} over {after['episodes']} episodes; "
          f"train reward by update {[round(h['reward_mean'], 2) if 'reward_mean' in h else 'no informative group' for h in res['history']]}; "
          f"malformed turns {before['invalid_format']:.2f} -> {after['invalid_format']:.2f}")
    assert before["invalid_format"] < 0.2, "the random-action warm start should already write well-formed actions"
    assert before["success"] < 0.35, "the warm start should carry no strategy (random-walk success is about 0.2)"
    # gains measured with 4 updates: lr 3e-4 +0.25, +0.28; lr 1e-3 +0.27, +0.30, +0.41 (less stable); one
    # evaluation of 96 episodes has a standard error of about 0.045, a difference of two about 0.063. A fresh-clone
    # run under load measured +0.14 with 64 episodes and failed the old +0.15 margin: with the expected gain
    # (~0.28) the +0.12 margin fails about 1 run in 100, and a policy that learned nothing passes it about 1 in 30
    assert after["success"] >= before["success"] + 0.12
