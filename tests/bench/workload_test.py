"""Workload generators: lengths, repeatability, shared prefixes that really share, tenant and SLO
mixes that honour their weights, dataset files and the errors on bad ones."""
import collections
import dataclasses
import json

import pytest

from tandem_bench import workload
from tandem_bench.workload import Lengths, WorkloadConfig, WorkloadError


def test_fixed_lengths():
    specs = workload.build(WorkloadConfig(Lengths(40), Lengths(7)), seed=1, count=50)
    assert all(s.input_len == 40 and len(s.user.split()) == 40 and s.output_len == 7
               for s in specs)
    assert all(w in workload.WORDS for s in specs for w in s.user.split())
    assert [s.index for s in specs] == list(range(50))


def test_uniform_lengths_stay_in_range_and_cover_it():
    specs = workload.build(WorkloadConfig(Lengths(100, 0.5), Lengths(10, 0.5)), seed=2, count=2000)
    inputs = [s.input_len for s in specs]
    outputs = [s.output_len for s in specs]
    assert min(inputs) == 50 and max(inputs) == 150
    assert min(outputs) == 5 and max(outputs) == 15
    assert abs(sum(inputs) / len(inputs) - 100) < 3
    assert all(len(s.user.split()) == s.input_len for s in specs)


def test_same_seed_same_requests_and_longer_lists_extend_shorter_ones():
    config = WorkloadConfig(Lengths(20, 0.5), Lengths(5, 0.5),
                            tenants=(workload.Tenant("a", 1), workload.Tenant("b", 1)))
    a = workload.build(config, seed=3, count=30)
    assert a == workload.build(config, seed=3, count=30)
    assert workload.build(config, seed=3, count=10) == a[:10]
    assert workload.build(config, seed=4, count=30) != a
    other = workload.build(config, seed=3, count=30, stream="rate1")
    assert [s.user for s in other] != [s.user for s in a]


def test_shared_prefix_really_shares():
    sp = workload.SharedPrefix(groups=3, prompts_per_group=4, prefix_len=50)
    specs = workload.build(WorkloadConfig(Lengths(10), Lengths(4), shared_prefix=sp), seed=5,
                           count=24)
    by_group = collections.defaultdict(set)
    for s in specs:
        by_group[s.prefix_group].add(s.system)
        assert len(s.system.split()) == 50 and len(s.user.split()) == 10
        assert s.prompt.startswith(s.system + " ")  # the completions prompt starts with it
        assert s.input_len == 60
    # One system prompt per group, different between groups.
    assert sorted(by_group) == [0, 1, 2]
    assert all(len(prefixes) == 1 for prefixes in by_group.values())
    assert len({next(iter(p)) for p in by_group.values()}) == 3
    # The first N x M requests are the N x M distinct prompts; the second pass repeats them.
    first = [(s.prefix_group, s.user) for s in specs[:12]]
    assert len(set(first)) == 12
    assert collections.Counter(g for g, _ in first) == {0: 4, 1: 4, 2: 4}
    assert [(s.prefix_group, s.user) for s in specs[12:]] == first


def test_tenant_and_slo_class_mixes_honour_their_weights():
    config = WorkloadConfig(
        Lengths(4), Lengths(2), model="base", priority=0,
        tenants=(workload.Tenant("big", 8, model="m-big"), workload.Tenant("small", 2, priority=3)),
        slo_classes=(workload.SloClass("chat", 0.7, ttft_ms=200, tpot_ms=50, priority=5),
                     workload.SloClass("batch", 0.3, tpot_ms=500)),
        ttft_slo_ms=1000)
    specs = workload.build(config, seed=6, count=5000)
    tenants = collections.Counter(s.tenant for s in specs)
    classes = collections.Counter(s.slo_class for s in specs)
    # Binomial standard deviations at n = 5000 are ~0.6 points; 3 points is ~5 of them.
    assert tenants["big"] / 5000 == pytest.approx(0.8, abs=0.03)
    assert classes["chat"] / 5000 == pytest.approx(0.7, abs=0.03)
    # Tenant and class are drawn independently.
    both = sum(1 for s in specs if s.tenant == "big" and s.slo_class == "chat")
    assert both / 5000 == pytest.approx(0.56, abs=0.03)
    for s in specs:
        assert s.model == ("m-big" if s.tenant == "big" else "base")
        if s.slo_class == "chat":
            assert (s.ttft_slo_ms, s.tpot_slo_ms, s.priority) == (200, 50, 5)  # class wins
        else:
            # The class's TPOT target; the default TTFT target; the tenant's priority.
            assert (s.ttft_slo_ms, s.tpot_slo_ms) == (1000, 500)
            assert s.priority == (3 if s.tenant == "small" else 0)


def test_slo_defaults_fill_only_missing_targets():
    specs = workload.build(WorkloadConfig(Lengths(4), Lengths(2), slo_classes=(
        workload.SloClass("a", 1, ttft_ms=100),)), seed=0, count=3)
    filled = workload.with_slo_defaults(specs, 999, 77)
    assert all((s.ttft_slo_ms, s.tpot_slo_ms) == (100, 77) for s in filled)


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_sharegpt_jsonl_dataset(tmp_path):
    path = write(tmp_path, "sharegpt.jsonl", [
        json.dumps({"conversations": [{"from": "human", "value": "What is a cat?"},
                                      {"from": "gpt", "value": "x" * 40}]}),
        json.dumps({"conversations": [{"from": "system", "value": "Be brief."},
                                      {"from": "human", "value": "Hello"},
                                      {"from": "gpt", "value": "Hi"}]}),
        json.dumps({"conversations": [{"from": "gpt", "value": "no question"}]}),  # skipped
        "",
    ])
    entries = workload.load_dataset(path)
    assert len(entries) == 2
    assert entries[0].user == "What is a cat?" and entries[0].output_len == 10  # 40 chars / 4
    assert entries[1].system == "Be brief." and entries[1].output_len == 1
    config = WorkloadConfig(Lengths(4), Lengths(9), dataset=entries)
    specs = workload.build(config, seed=1, count=6)
    assert {s.user for s in specs} == {"What is a cat?", "Hello"}
    assert {s.output_len for s in specs} == {10, 1}
    # --output-len given: it beats the dataset's lengths.
    config = WorkloadConfig(Lengths(4), Lengths(9), dataset=entries, output_len_override=True)
    assert {s.output_len for s in workload.build(config, seed=1, count=6)} == {9}


def test_prompt_dataset_as_json_array(tmp_path):
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps([{"prompt": "one two", "output_tokens": 3},
                                {"prompt": "three", "system": "sys"}]))
    entries = workload.load_dataset(path)
    assert [(e.user, e.system, e.output_len) for e in entries] == [("one two", "", 3),
                                                                   ("three", "sys", None)]
    specs = workload.build(WorkloadConfig(Lengths(4), Lengths(6), dataset=entries), seed=0, count=4)
    assert sorted({s.output_len for s in specs}) == [3, 6]  # no output_tokens: --output-len


def test_dataset_entries_may_name_their_slo_class(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "short question", "output_tokens": 8, "slo_class": "chat"},
        {"prompt": "long " * 50, "output_tokens": 2, "slo_class": "long"},
        {"prompt": "unnamed", "output_tokens": 3}]))
    classes = (workload.parse_slo_class("name=chat,weight=1,ttft_ms=300,priority=1"),
               workload.parse_slo_class("name=long,weight=1,ttft_ms=3000"))
    entries = workload.load_dataset(path)
    specs = workload.build(WorkloadConfig(Lengths(4), Lengths(6), dataset=entries,
                                          slo_classes=classes), seed=3, count=30)
    by_prompt = collections.defaultdict(set)
    for s in specs:
        by_prompt[s.user].add((s.slo_class, s.ttft_slo_ms, s.priority))
    assert by_prompt["short question"] == {("chat", 300, 1)}
    assert by_prompt["long " * 50] == {("long", 3000, 0)}
    assert {c for c, _, _ in by_prompt["unnamed"]} == {"chat", "long"}  # drawn by weight
    with pytest.raises(WorkloadError, match=r"names SLO class '(chat|long)', which no"):
        workload.build(WorkloadConfig(Lengths(4), Lengths(6), dataset=entries), seed=3, count=3)


@pytest.mark.parametrize("lines,message", [
    (['{"prompt": "a"}', "{not json"], r"bad\.jsonl:2: not valid JSON"),
    (['{"text": "a"}'], r"bad\.jsonl:1: expected 'conversations'"),
    (['{"prompt": ""}'], r"'prompt' must be a non-empty string"),
    (['{"prompt": "a", "output_tokens": 0}'], "'output_tokens' must be a positive integer"),
    (['{"conversations": [{"from": "gpt", "value": "x"}]}'], "holds no usable prompt"),
    (['{"conversations": [{"from": "human"}]}'], "needs a string 'value'"),
])
def test_bad_datasets_say_where(tmp_path, lines, message):
    with pytest.raises(WorkloadError, match=message):
        workload.load_dataset(write(tmp_path, "bad.jsonl", lines))


def test_missing_dataset_names_the_file(tmp_path):
    with pytest.raises(WorkloadError, match=r"dataset file '.*nowhere\.jsonl' does not exist"):
        workload.load_dataset(tmp_path / "nowhere.jsonl")


def test_spec_parsers():
    assert workload.parse_tenant("name=a,weight=0.8,model=m,priority=2") == \
        workload.Tenant("a", 0.8, "m", 2)
    assert workload.parse_slo_class("name=c, weight=1, ttft_ms=200, tpot_ms=40") == \
        workload.SloClass("c", 1.0, 200.0, 40.0, None)
    assert workload.parse_shared_prefix("4,8,512") == workload.SharedPrefix(4, 8, 512)
    for bad, message in [("name=a", "positive weight"), ("weight=1", "needs a name"),
                         ("name=a,weight=x", "weight must be a number"),
                         ("name=a,weight=1,colour=red", "unknown field"), ("name", "key=value")]:
        with pytest.raises(WorkloadError, match=message):
            workload.parse_tenant(bad)
    with pytest.raises(WorkloadError, match="ttft_ms must be >= 0"):
        workload.parse_slo_class("name=a,weight=1,ttft_ms=-5")
    for bad in ("4,8", "a,b,c", "0,1,1"):
        with pytest.raises(WorkloadError):
            workload.parse_shared_prefix(bad)
    with pytest.raises(WorkloadError, match="same name"):
        WorkloadConfig(tenants=(workload.Tenant("a", 1), workload.Tenant("a", 2)))
    with pytest.raises(WorkloadError, match="range ratio"):
        Lengths(10, 1.5)


def test_vocabulary_is_distinct_single_words():
    assert len(set(workload.WORDS)) == len(workload.WORDS) > 100
    assert all(w.isalpha() and w.islower() for w in workload.WORDS)


@pytest.mark.parametrize("config", [
    workload.WorkloadConfig(input_lengths=workload.Lengths(40, 0.5),
                            output_lengths=workload.Lengths(9, 0.3),
                            slo_classes=(workload.SloClass("a", 1, ttft_ms=5),
                                         workload.SloClass("b", 2)),
                            tenants=(workload.Tenant("x", 1, priority=3), workload.Tenant("y", 1))),
    workload.WorkloadConfig(shared_prefix=workload.SharedPrefix(3, 2, 12),
                            input_lengths=workload.Lengths(5, 0.5)),
])
def test_lengths_only_build_draws_the_same_requests(config):
    """text=False (what `tandem sim` uses) changes nothing but the synthetic prompts' text."""
    full = workload.build(config, 7, 50)
    lengths_only = workload.build(config, 7, 50, text=False)
    for a, b in zip(full, lengths_only):
        if config.shared_prefix is None:
            assert b.system == b.user == "" and len(a.user.split()) == a.input_len
            a = dataclasses.replace(a, system="", user="")
        assert a == b
