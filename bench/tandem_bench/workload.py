"""What is sent: a seeded list of requests (prompt, output length, model, priority, SLO targets).

Synthetic prompts are drawn from WORDS, each of which is one token (with its leading space) in the
default model's tokenizer (SmolLM2), so a prompt of N words is N tokens there; for other tokenizers
it is about N. The server's own count (usage.prompt_tokens) is what the results report.

Sources of prompts, one per workload:
  synthetic      --input-len / --output-len, fixed or uniform in [L(1-r), L(1+r)] (--range-ratio r)
  dataset        a JSONL file (or a JSON array) of ShareGPT conversations or {"prompt", "output_tokens"}
  shared prefix  N groups x M prompts: each group's system prompt (LEN tokens) is shared by its M
                 prompts, each with its own question of --input-len tokens

Independently of the source, each request draws a tenant (model and priority) and an SLO class
(name, TTFT and TPOT targets, priority) from weighted lists.
"""
import dataclasses
import json
import math
import pathlib

from .arrivals import rng_for

# One token each, after a space, in the default model's tokenizer (checked with its Tokenize RPC).
WORDS = tuple("""
the of and to in is was for on that with as by at from it his an were are which this be or has had
first one their its new after but who not they have her she two been other when there all during
into school time may years more most only over city some world would where later up such used many
can state about national out known university united then made year three also under being
following however before game well high since season part film life series group number between
team name called both did people found music we war area because each american south north
population him began album use several song including second house while day work through against
county family form end along within""".split())

# Characters per token when a dataset's text has to be measured without the model's tokenizer.
CHARS_PER_TOKEN = 4


class WorkloadError(ValueError):
    """A workload that cannot be built: a bad dataset file or bad specification."""


@dataclasses.dataclass
class RequestSpec:
    """One request of a workload. `system` (may be empty) and `user` make the prompt: the chat
    endpoint sends them as a system and a user message, the completions endpoint as one text."""
    index: int
    system: str
    user: str
    input_len: int           # prompt tokens asked for (datasets: an estimate), before templates
    output_len: int          # output tokens asked for (max_tokens)
    model: str | None = None
    priority: int = 0
    tenant: str | None = None
    slo_class: str | None = None
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    prefix_group: int | None = None

    @property
    def prompt(self):
        """The prompt as one text (completions endpoint)."""
        return f"{self.system} {self.user}" if self.system else self.user


@dataclasses.dataclass(frozen=True)
class Tenant:
    """A share of the traffic sent to one model and/or with one priority."""
    name: str
    weight: float
    model: str | None = None
    priority: int | None = None


@dataclasses.dataclass(frozen=True)
class SloClass:
    """A share of the traffic with its own latency targets (milliseconds; None: no target) and
    priority."""
    name: str
    weight: float
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    priority: int | None = None


@dataclasses.dataclass(frozen=True)
class Lengths:
    """A length distribution: `mean`, uniform in [mean(1-range_ratio), mean(1+range_ratio)]
    (integers, at least 1); range_ratio 0 is a fixed length."""
    mean: int
    range_ratio: float = 0.0

    def __post_init__(self):
        if self.mean < 1:
            raise WorkloadError(f"a length must be at least 1, not {self.mean}")
        if not 0.0 <= self.range_ratio < 1.0:
            raise WorkloadError(f"the range ratio must be in [0, 1), not {self.range_ratio}")

    def draw(self, rng):
        if self.range_ratio == 0:
            return self.mean
        low = max(1, math.floor(self.mean * (1 - self.range_ratio)))
        high = max(low, math.ceil(self.mean * (1 + self.range_ratio)))
        return int(rng.integers(low, high + 1))


@dataclasses.dataclass(frozen=True)
class SharedPrefix:
    """`groups` system prompts of `prefix_len` tokens, each shared by `prompts_per_group` prompts."""
    groups: int
    prompts_per_group: int
    prefix_len: int

    def __post_init__(self):
        if min(self.groups, self.prompts_per_group, self.prefix_len) < 1:
            raise WorkloadError("shared prefix: groups, prompts per group and length must be >= 1")


@dataclasses.dataclass(frozen=True)
class DatasetEntry:
    """One prompt of a dataset file."""
    system: str
    user: str
    output_len: int
    input_len: int
    # The --slo-class it belongs to (None: drawn by weight like generated prompts).
    slo_class: str | None = None


def words(rng, count):
    """`count` words of WORDS, drawn uniformly: a text of about `count` tokens."""
    picks = rng.integers(0, len(WORDS), count)
    return " ".join(WORDS[i] for i in picks)


def estimate_tokens(text):
    """Tokens of a text without its tokenizer: CHARS_PER_TOKEN characters per token, at least 1."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


# ------------------------------------------------------------------------------------------------
# Dataset files.
# ------------------------------------------------------------------------------------------------

_HUMAN = ("human", "user")
_MODEL = ("gpt", "assistant", "chatgpt", "bard", "model")


def _entry_from_record(record, where):
    if not isinstance(record, dict):
        raise WorkloadError(f"{where}: expected a JSON object")
    if "conversations" in record:
        turns = record["conversations"]
        if not isinstance(turns, list):
            raise WorkloadError(f"{where}: 'conversations' must be an array")
        system, user, reply = "", None, None
        for turn in turns:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise WorkloadError(f"{where}: each conversation turn needs a string 'value'")
            speaker = str(turn.get("from", "")).lower()
            if speaker == "system" and user is None:
                system = turn["value"]
            elif speaker in _HUMAN and user is None:
                user = turn["value"]
            elif speaker in _MODEL and user is not None:
                reply = turn["value"]
                break
        if not user:
            return None  # no question in it: skipped, as vllm does with too-short conversations
        output_len = estimate_tokens(reply) if reply else None
        return DatasetEntry(system, user, output_len, estimate_tokens(system + user))
    if "prompt" in record:
        prompt = record["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise WorkloadError(f"{where}: 'prompt' must be a non-empty string")
        output_len = record.get("output_tokens")
        if output_len is not None and (not isinstance(output_len, int) or output_len < 1):
            raise WorkloadError(f"{where}: 'output_tokens' must be a positive integer")
        system = record.get("system", "")
        if not isinstance(system, str):
            raise WorkloadError(f"{where}: 'system' must be a string")
        slo_class = record.get("slo_class")
        if slo_class is not None and (not isinstance(slo_class, str) or not slo_class):
            raise WorkloadError(f"{where}: 'slo_class' must be a non-empty string")
        return DatasetEntry(system, prompt, output_len, estimate_tokens(system + prompt),
                            slo_class)
    raise WorkloadError(f"{where}: expected 'conversations' (ShareGPT) or 'prompt' in the object")


def load_dataset(path):
    """The entries of a dataset file: JSON Lines (one object a line) or one JSON array of objects.
    Objects are ShareGPT conversations ({"conversations": [{"from": "human", "value": ...},
    {"from": "gpt", "value": ...}]}: the first human turn is the prompt, a system turn before it
    the system prompt, and the reply's length the output length) or {"prompt": ...,
    "output_tokens": ..., "system": ..., "slo_class": ...} (all but prompt optional; slo_class
    names the --slo-class of the entry, e.g. long prompts with looser targets). Entries with no
    output length take --output-len."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise WorkloadError(f"dataset file '{path}' does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise WorkloadError(f"cannot read dataset file '{path}': {error}") from error
    entries = []
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise WorkloadError(f"{path}: not valid JSON: {error}") from error
        for i, record in enumerate(records):
            entries.append(_entry_from_record(record, f"{path}: element {i}"))
    else:
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise WorkloadError(f"{path}:{number}: not valid JSON: {error}") from error
            entries.append(_entry_from_record(record, f"{path}:{number}"))
    entries = [e for e in entries if e is not None]
    if not entries:
        raise WorkloadError(f"dataset file '{path}' holds no usable prompt")
    return entries


# ------------------------------------------------------------------------------------------------
# Weighted choices and the workload itself.
# ------------------------------------------------------------------------------------------------


def _weighted_pick(rng, items):
    if not items:
        return None
    weights = [item.weight for item in items]
    total = sum(weights)
    return items[int(rng.choice(len(items), p=[w / total for w in weights]))]


@dataclasses.dataclass
class WorkloadConfig:
    """Everything that decides the requests of a run (not their timing)."""
    input_lengths: Lengths = Lengths(128)
    output_lengths: Lengths = Lengths(64)
    dataset: list | None = None           # DatasetEntry list, or None for synthetic prompts
    output_len_override: bool = False     # --output-len given: it beats the dataset's lengths
    shared_prefix: SharedPrefix | None = None
    tenants: tuple = ()
    slo_classes: tuple = ()
    model: str | None = None
    priority: int = 0
    ttft_slo_ms: float | None = None      # for requests whose class sets none
    tpot_slo_ms: float | None = None

    def __post_init__(self):
        if self.dataset is not None and self.shared_prefix is not None:
            raise WorkloadError("a dataset and a shared-prefix workload cannot be combined")
        for kind, items in (("tenant", self.tenants), ("SLO class", self.slo_classes)):
            names = [item.name for item in items]
            if len(set(names)) != len(names):
                raise WorkloadError(f"two {kind}s have the same name")
            if any(not item.weight > 0 for item in items):
                raise WorkloadError(f"every {kind} needs a positive weight")


def build(config, seed, count, stream="requests", text=True):
    """The first `count` requests of the workload seeded by `seed` on `stream`. The same (config,
    seed, stream) gives the same requests, and a longer list starts with a shorter one, so both
    sides of an A/B comparison send the same requests. Different streams give different prompts
    from the same distributions (each rate of a sweep has its own, so that it does not find the
    previous rate's prompts in the prefix cache). text=False leaves synthetic prompts' text
    empty (the simulator needs only their lengths) and draws exactly the same random numbers, so
    every other field is the same."""
    prompt_rng = rng_for(seed, stream, "prompts")
    mix_rng = rng_for(seed, stream, "mix")
    order = None
    prefixes = None
    if config.dataset is not None:
        order = rng_for(seed, stream, "dataset-order").permutation(len(config.dataset))
    if config.shared_prefix is not None:
        sp = config.shared_prefix
        prefix_rng = rng_for(seed, stream, "shared-prefixes")
        prefixes = [words(prefix_rng, sp.prefix_len) for _ in range(sp.groups)]
        pairs = [(g, u) for g in range(sp.groups) for u in range(sp.prompts_per_group)]
        pair_order = rng_for(seed, stream, "shared-prefix-order").permutation(len(pairs))
        question_rng = rng_for(seed, stream, "shared-prefix-questions")
        questions = {}
        for g, u in pairs:
            questions[(g, u)] = (words(question_rng, config.input_lengths.draw(question_rng)),
                                 config.output_lengths.draw(question_rng))
    specs = []
    for i in range(count):
        group = None
        if config.dataset is not None:
            entry = config.dataset[order[i % len(order)]]
            system, user = entry.system, entry.user
            input_len = entry.input_len
            output_len = entry.output_len
            if output_len is None or config.output_len_override:
                output_len = config.output_lengths.draw(prompt_rng)
        elif prefixes is not None:
            # Pass k over the N x M prompts repeats them in the same shuffled order.
            group, user_index = pairs[pair_order[i % len(pairs)]]
            system = prefixes[group]
            user, output_len = questions[(group, user_index)]
            input_len = config.shared_prefix.prefix_len + len(user.split())
        else:
            input_len = config.input_lengths.draw(prompt_rng)
            output_len = config.output_lengths.draw(prompt_rng)
            if text:
                system, user = "", words(prompt_rng, input_len)
            else:
                prompt_rng.integers(0, len(WORDS), input_len)  # the draw words() would make
                system, user = "", ""
        tenant = _weighted_pick(mix_rng, list(config.tenants))
        slo_class = _weighted_pick(mix_rng, list(config.slo_classes))
        if config.dataset is not None and entry.slo_class is not None:
            named = [c for c in config.slo_classes if c.name == entry.slo_class]
            if not named:
                raise WorkloadError(f"dataset entry {order[i % len(order)] + 1} names SLO class "
                                    f"'{entry.slo_class}', which no --slo-class defines")
            slo_class = named[0]
        priority = config.priority
        if tenant is not None and tenant.priority is not None:
            priority = tenant.priority
        if slo_class is not None and slo_class.priority is not None:
            priority = slo_class.priority
        ttft, tpot = config.ttft_slo_ms, config.tpot_slo_ms
        if slo_class is not None:
            ttft = slo_class.ttft_ms if slo_class.ttft_ms is not None else ttft
            tpot = slo_class.tpot_ms if slo_class.tpot_ms is not None else tpot
        specs.append(RequestSpec(
            index=i, system=system, user=user, input_len=input_len, output_len=output_len,
            model=(tenant.model if tenant is not None and tenant.model else config.model),
            priority=priority, tenant=tenant.name if tenant else None,
            slo_class=slo_class.name if slo_class else None, ttft_slo_ms=ttft, tpot_slo_ms=tpot,
            prefix_group=group))
    return specs


def with_slo_defaults(specs, ttft_ms, tpot_ms):
    """The specs with TTFT / TPOT targets filled in where neither their class nor the defaults
    set one (used once an SLO scale has been turned into milliseconds)."""
    out = []
    for spec in specs:
        out.append(dataclasses.replace(
            spec,
            ttft_slo_ms=spec.ttft_slo_ms if spec.ttft_slo_ms is not None else ttft_ms,
            tpot_slo_ms=spec.tpot_slo_ms if spec.tpot_slo_ms is not None else tpot_ms))
    return out


def parse_fields(text, what):
    """`name=a,weight=0.8,ttft_ms=200` as a dict of strings; a clear error otherwise."""
    fields = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise WorkloadError(f"{what} '{text}': expected key=value pairs separated by commas")
        fields[key.strip()] = value.strip()
    return fields


def _number(fields, key, what, text, cast=float, minimum=None):
    if key not in fields:
        return None
    try:
        value = cast(fields.pop(key))
    except ValueError:
        raise WorkloadError(f"{what} '{text}': {key} must be a number") from None
    if minimum is not None and value < minimum:
        raise WorkloadError(f"{what} '{text}': {key} must be >= {minimum}")
    return value


def parse_tenant(text):
    """--tenant "name=a,weight=0.8[,model=M][,priority=P]"."""
    fields = parse_fields(text, "tenant")
    name = fields.pop("name", None)
    weight = _number(fields, "weight", "tenant", text, minimum=0)
    priority = _number(fields, "priority", "tenant", text, cast=int)
    model = fields.pop("model", None)
    if fields:
        raise WorkloadError(f"tenant '{text}': unknown field(s) {', '.join(sorted(fields))} "
                            "(name, weight, model, priority)")
    if not name or weight is None or weight <= 0:
        raise WorkloadError(f"tenant '{text}': needs a name and a positive weight")
    return Tenant(name, weight, model, priority)


def parse_slo_class(text):
    """--slo-class "name=chat,weight=0.8,ttft_ms=200,tpot_ms=50[,priority=1]"."""
    fields = parse_fields(text, "SLO class")
    name = fields.pop("name", None)
    weight = _number(fields, "weight", "SLO class", text, minimum=0)
    ttft = _number(fields, "ttft_ms", "SLO class", text, minimum=0)
    tpot = _number(fields, "tpot_ms", "SLO class", text, minimum=0)
    priority = _number(fields, "priority", "SLO class", text, cast=int)
    if fields:
        raise WorkloadError(f"SLO class '{text}': unknown field(s) {', '.join(sorted(fields))} "
                            "(name, weight, ttft_ms, tpot_ms, priority)")
    if not name or weight is None or weight <= 0:
        raise WorkloadError(f"SLO class '{text}': needs a name and a positive weight")
    return SloClass(name, weight, ttft, tpot, priority)


def parse_shared_prefix(text):
    """--shared-prefix "N,M,LEN"."""
    parts = text.split(",")
    try:
        groups, per_group, length = (int(p) for p in parts)
    except ValueError:
        raise WorkloadError(f"shared prefix '{text}': expected N,M,LEN (three integers: groups, "
                            "prompts per group, prefix tokens)") from None
    return SharedPrefix(groups, per_group, length)
