"DreamGym's data parts against real envs and real encoders: offline transitions, replay retrieval, EM text format, teachers, curriculum."
import dataclasses, math, random
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from labmod.core import Observation, Task, Trajectory, Turn
from labmod.envs.core import list_tasks, make_env
from labmod.dreamgym.replay import ReplayBuffer, Transition, get_encoder
from labmod.rollout import RolloutConfig, RolloutEngine
from labmod.dreamgym.data import (EMPrompt, GoldPolicy, LLMStateMapper, LLMTeacher, RuleTeacher, StaleRandomPolicy, abstract_state, annotate,
                                  collect_offline_transitions, em_sft_examples, em_target_spans, format_em_target, parse_em_output,
                                  transitions)
from labmod.dreamgym.curriculum import (TaskVariationGenerator, group_reward_variance, mix_tasks, parse_variations,
                               select_seed_tasks)


@pytest.fixture(scope="module")
def twx_tasks():
    return list_tasks("textworld_express", "train", games=["coin", "sorting", "twc"], n_per_game=2)


@pytest.fixture(scope="module")
def offline(twx_tasks):
    # stale_rate 0.3: enough actions that were valid earlier but not now, so invalid transitions are in the data
    return collect_offline_transitions("textworld_express", twx_tasks, policies=("gold", StaleRandomPolicy(stale_rate=0.3)), steps=15,
                                       seed=0, n_envs=2, progress=False)


def test_offline_transitions_come_from_the_real_env(offline, twx_tasks):
    gold = [t for t in offline if t.source == "gold"]
    rand = [t for t in offline if t.source == "random"]
    assert gold and rand
    for task in twx_tasks:  # every gold episode follows the gold path to success, with the env's own rewards
        g = [t for t in gold if t.task_id == task.id]
        assert g and g[-1].done and g[-1].metadata["success"] and sum(t.reward for t in g) > 0
        assert [t.action for t in g] == [t.metadata["expert_action"] for t in g]
        assert all(a.next_state == b.state for a, b in zip(g, g[1:]))       # states chain along the episode
        assert all(b.history == a.history + [(a.action, a.next_state)] for a, b in zip(g, g[1:])) and g[0].history == []
    assert all(0.0 <= t.reward <= 1.0 and t.instruction for t in offline)
    assert any(t.metadata["valid"] is False for t in rand), "random policy with stale actions produced no invalid step"
    assert gold[0].state.startswith("Location: ")                          # the abstract mapper ran on the room text
    # the same gold episode played again gives the same transitions (TWX is deterministic)
    with RolloutEngine(GoldPolicy(), lambda: make_env("textworld_express"), RolloutConfig(max_turns=15, n_envs=1)) as eng:
        again = transitions(eng.run(twx_tasks[:1])[0][0])
    assert [(t.state, t.action, t.next_state, t.reward, t.done) for t in again] == \
           [(t.state, t.action, t.next_state, t.reward, t.done) for t in gold if t.task_id == twx_tasks[0].id]


def _unique_keys(ts):
    seen, out = {}, []
    for t in ts: seen.setdefault(t.key, []).append(t)
    return [v[0] for v in seen.values() if len(v) == 1]


@pytest.mark.parametrize("encoder", ["hashing", "minilm"])
def test_buffer_returns_each_transition_for_its_own_key(offline, encoder, tmp_path):
    # MiniLM encodes a few strings per second on a busy 2-core machine: give it a slice of the data
    data = offline if encoder == "hashing" else offline[:40]
    buf = ReplayBuffer(get_encoder(encoder))
    assert buf.add(data) == len(data) and len(buf) == len(data)
    probe = _unique_keys(data)[:15 if encoder == "minilm" else None]
    assert len(probe) >= 10
    hits = buf.search_many([(t.state, t.action) for t in probe], k=3)
    for t, h in zip(probe, hits):
        assert h[0][0] is t and h[0][1] == pytest.approx(1.0, abs=1e-4) and h[0][1] >= h[1][1] >= h[2][1]
    # filters: same task only / other tasks only
    t0 = probe[0]
    assert all(x.task_id == t0.task_id for x, _ in buf.search(t0.state, t0.action, k=5, task_id=t0.task_id))
    assert all(x.task_id != t0.task_id for x, _ in buf.search(t0.state, t0.action, k=5, exclude_task_id=t0.task_id))
    # save / load: identical results (hashing rebuilds its encoder from the saved spec)
    buf.save(tmp_path / "buf")
    again = ReplayBuffer.load(tmp_path / "buf", encoder=None if encoder == "hashing" else buf.encoder)
    assert again.transitions == buf.transitions and np.array_equal(again.embeddings, buf.embeddings)
    q = [(t.state, t.action) for t in data[::5]]
    assert [[(x, s) for x, s in row] for row in again.search_many(q, k=5)] == [[(x, s) for x, s in row] for row in buf.search_many(q, k=5)]


def test_synthetic_enrichment_respects_its_cap(offline):
    buf = ReplayBuffer(get_encoder("hashing", dim=256), max_synthetic_share=0.25)
    buf.add(offline)
    syn = [dataclasses.replace(t, task_id=t.task_id + "/syn", next_state="(predicted) " + t.next_state) for t in offline]
    buf.add(syn, source="synthetic")
    s = buf.stats()["by_source"]
    assert s["synthetic"] / len(buf) <= 0.25 and s["synthetic"] >= int(0.33 * len(offline)) - 1
    assert s["gold"] + s["random"] == len(offline)                        # real data is never evicted


_field = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200).filter(lambda s: "<" not in s and s.strip())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_parse_em_output_never_raises(text):
    out = parse_em_output(text)
    assert isinstance(out.ok, bool) and (out.ok or out.error)


@settings(max_examples=200, deadline=None)
@given(_field, _field, st.floats(0, 1, allow_nan=False), st.booleans(), st.booleans(), st.integers(0, 10_000), st.text(max_size=20))
def test_em_target_round_trips_and_survives_mutation(reasoning, next_state, reward, done, with_reasoning, cut, junk):
    tgt = format_em_target(reasoning, next_state, reward, done, with_reasoning=with_reasoning)
    out = parse_em_output(tgt)
    assert out.ok, out.error
    assert (out.next_state, out.reward, out.done) == (next_state.strip(), reward, done)
    assert out.reasoning == (reasoning.strip() if with_reasoning else None)
    sp = em_target_spans(tgt)
    assert sp["reasoning"][1] == sp["outcome"][0] and tgt[slice(*sp["outcome"])].startswith("<next_state>")
    i = cut % (len(tgt) + 1)
    for mutated in (tgt[:i], tgt[:i] + junk + tgt[i:], tgt[i:]):
        parse_em_output(mutated)                                           # must not raise


def test_rule_teacher_is_faithful(offline):
    teacher = RuleTeacher()
    invalid = [t for t in offline if t.metadata["valid"] is False]
    rewarded = [t for t in offline if t.reward > 0]
    assert invalid and rewarded
    for t in invalid: assert "invalid" in teacher.explain(t)
    for t in rewarded:
        e = teacher.explain(t)
        assert f"reward is {t.reward:g}" in e and "invalid" not in e
    for t in [t for t in offline if t.metadata["valid"] and t.reward == 0][:20]:
        assert "invalid" not in teacher.explain(t) and "reward is 0" in teacher.explain(t)


def test_em_sft_examples_keep_reasoning_separable(offline):
    ann = annotate(offline, RuleTeacher(), progress=False)
    buf = ReplayBuffer(get_encoder("hashing"))
    buf.add(ann)
    ex = em_sft_examples(ann, buf, EMPrompt(k=2))
    for (msgs, tgt, sp), t in zip(ex, ann):
        assert msgs[0]["role"] == "system" and t.action in msgs[1]["content"]
        reasoning, outcome = tgt[slice(*sp["reasoning"])], tgt[slice(*sp["outcome"])]
        assert t.reasoning in reasoning and t.next_state in outcome and "<think>" not in outcome
        assert parse_em_output(tgt).ok
    # retrieval leaves the example's own task out of its context: the demonstrations shown are other tasks' transitions
    for (msgs, _, _), t in list(zip(ex, ann))[:10]:
        shown = [d for d, _ in buf.search(t.state, t.action, k=2, exclude_task_id=t.task_id)]
        assert shown and all(d.task_id != t.task_id and f"Action: {d.action}" in msgs[1]["content"] for d in shown)
    plain = em_sft_examples(ann[:5], buf, EMPrompt(k=2, with_reasoning=False))
    assert all("<think>" not in e.target and e.spans["reasoning"] == (0, 0) for e in plain)
    with pytest.raises(ValueError, match="annotate"):
        em_sft_examples(offline[:2], buf, EMPrompt(k=1))


def _traj(tid, r):
    return Trajectory(Task(tid, "textworld_express"), Observation("s"), [Turn("p", reward=r, done=True, info={"success": r > 0})])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=8), min_size=1, max_size=12),
       st.integers(0, 15), st.floats(0, 0.3))
def test_variance_selection_obeys_its_bounds(reward_lists, k, min_var):
    groups = [[_traj(f"t{i}", r) for r in rs] for i, rs in enumerate(reward_lists)]
    var = group_reward_variance(groups)
    for i, rs in enumerate(reward_lists):
        p = sum(rs) / len(rs)
        assert var[f"t{i}"] == pytest.approx(p * (1 - p)) and 0 <= var[f"t{i}"] <= 0.25
    picked = select_seed_tasks(var, k, min_var=min_var)
    assert len(picked) <= k and all(var[t] >= min_var for t in picked)
    rest = [v for t, v in var.items() if t not in picked and v >= min_var]
    assert not picked or not rest or min(var[t] for t in picked) >= max(rest)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 20), st.integers(0, 20), st.floats(0, 1), st.integers(0, 40), st.integers(0, 2**31))
def test_lambda_mixing_bounds_the_synthetic_share(n_real, n_syn, lam, batch, seed):
    real = [Task(f"r{i}", "e") for i in range(n_real)]
    syn = [Task(f"s{i}", "e", metadata={"synthetic": True}) for i in range(n_syn)]
    b = mix_tasks(real, syn, lam, batch, random.Random(seed))
    k = sum(bool(t.metadata.get("synthetic")) for t in b)
    assert len(b) == batch and k <= lam * batch + 1e-9 and k == min(math.floor(lam * batch + 1e-9), n_syn)


@pytest.fixture(scope="module")
def tiny_lm():
    models = pytest.importorskip("labmod.models")
    try: return models.load_lm("tiny")
    except (models.BackendUnavailable, ImportError) as e: pytest.skip(f"tiny model unavailable: {e}")


def test_llm_teacher_and_mapper_with_the_tiny_model(tiny_lm, offline):
    ts = offline[:1]
    expl = LLMTeacher(tiny_lm, max_new_tokens=16).explain_many(ts)
    assert len(expl) == 1 and all(isinstance(e, str) and e.strip() for e in expl)
    room = "You are in the kitchen. In one part of the room you see a stove. There is also a coin. \n"
    s = LLMStateMapper(tiny_lm, "textworld_express", max_new_tokens=16)(Observation(room), "Find the coin.")
    assert isinstance(s, str) and s.strip()


def test_variation_generator_with_the_tiny_model(tiny_lm):
    lm = tiny_lm
    seed = Task("textworld_express/coin/train/0", "textworld_express", instruction="Find the coin and take it.",
                config={"game": "coin", "seed": 0})
    gen = TaskVariationGenerator(lm, max_new_tokens=32)
    out = gen.vary_many([seed, dataclasses.replace(seed, id="x", instruction="Sort the objects by weight.")], n=3, seed=0)
    assert len(out) == 2
    for tasks in out:
        for t in tasks:
            assert t.instruction and t.metadata["parent"] in (seed.id, "x") and t.metadata["synthetic"] is True
            assert t.config == seed.config and t.id.startswith(t.metadata["parent"] + "/var-")
    assert len(gen.last_outputs) == 2 and all(reason for _, reason in gen.last_rejected)
    # every line the model wrote is either an accepted task, a rejection with a reason, or beyond the n asked for
    for tasks, raw in zip(out, gen.last_outputs):
        cands = parse_variations(raw)
        assert all(t.instruction in cands for t in tasks) and len(tasks) <= 3
    assert sum(map(len, out)) + len(gen.last_rejected) <= sum(len(parse_variations(r)) for r in gen.last_outputs)
    rejected = {s for s, _ in gen.last_rejected}
    for raw, tasks in zip(gen.last_outputs, out):
        if len(tasks) < 3: assert set(parse_variations(raw)) <= rejected | {t.instruction for t in tasks}
