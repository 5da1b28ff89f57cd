"""parse_answer never raises and keeps its invariants on arbitrary text: unicode, nested, unbalanced and
odd-cased tags, and completions built from the real grammar with noise around it."""
import re

from hypothesis import HealthCheck, given, settings, strategies as st

from labmod.agent import AgentState, ParsedAction, TASK_FORMAT, parse_answer

MEMORY = dict(fields=("memory", "progress", "intention", "action"), required=("memory", "progress", "intention", "action"))
FIELDS = {"task": {}, "memory": MEMORY}

TAGS = ["<action>", "</action>", "<ACTION>", "</ Action >", "<think>", "</think>", "<memory>", "</memory>",
        "<progress>", "</progress>", "<intention>", "</intention>", "<", ">", "</", "<action", "action>"]
pieces = st.one_of(st.sampled_from(TAGS), st.text(max_size=12), st.sampled_from(["go north", "  take  milk ", "\n", "é😀\u200b"]))
tag_soup = st.lists(pieces, max_size=25).map("".join)
VALID = ["go north", "take milk", "open fridge"]


def _check(p: ParsedAction, valid):
    assert isinstance(p, ParsedAction)
    assert not (p.error or "").startswith("parser error"), p.error  # the catch-all must never be what answers
    if p.action is None:
        assert not p.valid_format and p.error
    else:
        assert p.action == " ".join(p.action.split()) and p.action  # stripped, whitespace collapsed, non-empty
        assert not re.search(r"<\s*/?\s*(action|think)\s*>", p.action, re.I)
    if p.valid_format: assert p.error is None and p.action is not None
    if valid is None or p.action is None: assert p.in_valid_actions is None
    else: assert p.in_valid_actions == (p.action in valid)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_arbitrary_unicode_never_raises(text):
    for valid in (None, VALID):
        _check(parse_answer(text, valid_actions=valid), valid)
    _check(parse_answer(text, **MEMORY), None)


@settings(max_examples=600, deadline=None)
@given(tag_soup, st.sampled_from([None, VALID]), st.sampled_from(["task", "memory"]))
def test_tag_soup_never_raises(text, valid, fmt):
    _check(parse_answer(text, valid_actions=valid, **FIELDS[fmt]), valid)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.sampled_from(VALID), st.text(max_size=40).filter(lambda s: "<" not in s),
       st.sampled_from(["action", "ACTION", "Action", " action "]), st.sampled_from(["", " ", "\n\t"]))
def test_well_formed_completion_is_read(prefix, action, think, tagname, pad):
    prefix = re.sub(r"<", "(", prefix)  # noise before the answer holds no tags
    text = f"{prefix}<think>{think}</think><{tagname}>{pad}{action.upper()}{pad}</{tagname}>"
    p = parse_answer(text, valid_actions=VALID)
    assert p.valid_format and p.action == action and p.in_valid_actions and p.think == think.strip()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60).filter(lambda s: "<" not in s and s.strip()))
def test_action_outside_list_is_kept(action):
    p = parse_answer(f"<action>{action}</action>", valid_actions=VALID)
    assert p.action == " ".join(action.split())
    assert p.in_valid_actions == (p.action.lower() in VALID)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300), st.lists(st.tuples(st.text(max_size=80), st.text(max_size=20)), max_size=6),
       st.lists(st.text(max_size=20), max_size=80), st.integers(0, 50))
def test_task_format_any_text(obs, history, actions, step):
    msgs = TASK_FORMAT.messages(AgentState(obs, actions, instruction="do it", history=history, step=step, max_steps=50), history_k=3)
    assert [m["role"] for m in msgs] == ["system", "user"] and all(isinstance(m["content"], str) for m in msgs)
    assert len(msgs[1]["content"]) < 1200 + 3 * 300 + 60 * 30 + 2000  # the caps bound the prompt


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(["<", "< /", "<action", "</ action"]), st.integers(1000, 20000), st.sampled_from([" ", "\t", "-", "<"]))
def test_long_runs_parse(head, n, fill):
    "Long runs after a tag opening (the old pattern backtracked quadratically on them) still parse to a named error."
    p = parse_answer(head + fill * n + "action>x", **MEMORY)
    _check(p, None)
