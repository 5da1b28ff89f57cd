"""A run repeats exactly whatever the envs' timing: each state's sampling seed follows from (seed, run, episode, turn),
and each prompt draws from its own generator, so what an episode samples does not depend on which other episodes
were waiting with it (before, one seed per policy call made a rerun differ whenever the batches formed differently:
`make demo` read base 0.125 against 0.236 for the same parameters)."""
import pytest

from labmod.agent import Agent
from labmod.envs.core import list_tasks, make_env
from labmod.models import load_lm
from labmod.rollout import RolloutConfig, RolloutEngine

pytestmark = pytest.mark.timeout(600)


def test_an_episode_samples_the_same_whatever_its_batch():
    agent = Agent(load_lm("tiny", seed=0), max_new_tokens=12, history_k=0)
    tasks = list_tasks("textworld_express", "train", games=["coin"], n_per_game=3)

    def play(n_envs, mode, max_batch, runs=1):
        cfg = RolloutConfig(max_turns=4, n_envs=n_envs, mode=mode, max_batch=max_batch, seed=3)
        with RolloutEngine(agent, lambda: make_env("textworld_express"), cfg) as eng:
            out = [[[(t.task.id, t.metadata["member"], tuple(tu.completion_ids)) for tu in t.turns] for g in eng.run(tasks, group_size=2) for t in g]
                   for _ in range(runs)]
            return out, eng.stats.mean_batch
    (one,), b1 = play(1, "sync", 1)                  # every state alone
    (wide,), b4 = play(4, "async", 16)               # whatever was waiting, together
    (mixed, again), b2 = play(3, "sync", 2, runs=2)  # lockstep in pairs; then the same tasks a second time
    assert b1 == 1 and b4 > 1                        # the batches really differed
    assert one == wide == mixed                      # ... and every episode sampled the same tokens
    assert again != mixed                            # a second run() of the same tasks samples anew
    members = {e[0][2] for e in one if e}            # the two members of a group explore differently
    assert len(members) > len(tasks)
