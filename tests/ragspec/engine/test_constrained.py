"""Constrained decoding: speculative == plain == a brute-force masked greedy loop, on tiny random models.

The reference recomputes everything each step: the whole sequence through the model (no cache)
and the mask from a fresh llguidance matcher fed the whole output (no rollback), so it shares no
state handling with the generator.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import llguidance
import pytest
import torch

from ragspec.engine.config import GenerationConfig, GenerationConfigError
from ragspec.engine.constraints import Constraint, ConstraintError, Grammar, engine_tokenizer
from ragspec.engine.drafting import Draft, DraftSource
from ragspec.decoding.generator import SpeculativeGenerator
from ragspec.backends.pytorch.loading import LoadedModel
from ragspec.engine.ngram import NgramDrafter
from ragspec.engine.policy import AdaptivePolicy, FixedPolicy
from ragspec.engine.tool_calls import Tool, tool_call_constraint

from tests.ragspec.decoding.test_generator import NoisyOracle, assert_same_or_tie
from tests.ragspec.tiny import EOS, tiny_model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "role": {"enum": ["author", "editor", "reviewer"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
    },
    "required": ["name", "age", "role", "active", "tags"],
    "additionalProperties": False,
}
CONSTRAINTS = {
    "schema": Constraint.json_schema(PERSON),
    "json": Constraint.json(),
    "regex": Constraint.regex(r"(yes|no): [a-z ]{1,20}\. (because|since) [0-9]{2,6}!"),
    "lark": Constraint.lark('start: "ids=[" ID ("," ID)* "]"\nID: /[a-f0-9]{2,4}/'),
}


def fresh_mask(lm: LoadedModel, constraint: Constraint, output: Sequence[int]) -> torch.Tensor:
    """Allowed next tokens after ``output``, from a new matcher (bool ``[vocab]``)."""
    vocab = lm.model.config.vocab_size
    matcher = llguidance.LLMatcher(engine_tokenizer(lm.tokenizer, vocab, [EOS]), constraint.grammar, log_level=0)
    assert matcher.consume_tokens(list(output)), matcher.get_error()
    bits = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32)
    return ((bits.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:vocab].bool()


@torch.inference_mode()
def brute_masked_greedy(lm: LoadedModel, constraint: Constraint, prompt: Sequence[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        logits = lm.model(torch.tensor([list(prompt) + out])).logits[0, -1]
        token = int(logits.masked_fill(~fresh_mask(lm, constraint, out), float("-inf")).argmax())
        if token == EOS:
            break
        out.append(token)
    return out


def valid_json(text: str, schema: dict | None) -> None:
    value = json.loads(text)
    if schema is not None:
        assert set(value) == set(schema["required"])
        assert value["role"] in schema["properties"]["role"]["enum"] and isinstance(value["active"], bool)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", list(CONSTRAINTS))
@pytest.mark.parametrize("seed", range(3))
def test_constrained_speculation_equals_brute_force_masked_greedy(kind: str, seed: int) -> None:
    vocab = [257, 300, 257][seed]
    lm = tiny_model(vocab, seed)
    constraint = CONSTRAINTS[kind]
    rng = random.Random(seed)
    prompt = lm.tokenizer.encode(rng.choice(['{"name": "ann", "age": 41}', "ids=[ab,c0] yes: fine", "x"]))
    # Passages with valid fragments (copies that the grammar keeps) and invalid ones (cut).
    passages = ['{"name": "ann", "age": 41, "role": "editor", "active": true, "tags": []}', "ids=[ab,c0,ff]",
                "yes: it is so. because 1234!", "ann age 41 editor \x01 true"]
    n = 90
    expected = brute_masked_greedy(lm, constraint, prompt, n)
    gen = SpeculativeGenerator(lm, drafter=NgramDrafter(), policy=FixedPolicy(k=rng.choice([2, 5, 12])))
    plain = gen.generate(prompt, max_new_tokens=n, speculation=False, constraint=constraint)
    spec = gen.generate(prompt, references=passages, max_new_tokens=n, constraint=constraint)
    assert_same_or_tie(lm, prompt, expected, plain.token_ids)
    assert spec.token_ids == plain.token_ids and spec.text == plain.text
    assert plain.stats.drafted_tokens == 0 and plain.stats.masks == plain.stats.forward_passes
    if kind in ("schema", "lark"):  # keys and punctuation were drafted by the grammar, and kept
        grammar = spec.stats.by_source["grammar"]
        assert grammar.accepted >= 3 and spec.stats.forward_passes < plain.stats.forward_passes
    if spec.finish_reason == "eos" and kind in ("schema", "json"):
        valid_json(spec.text, PERSON if kind == "schema" else None)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", range(5))
def test_noisy_drafts_are_cut_and_rolled_back_exactly(seed: int) -> None:
    """Drafts of the true output with random corruptions: the grammar cuts impossible tokens, the
    target rejects possible wrong ones; output stays the masked greedy output."""
    lm = tiny_model(300, seed + 10, layers=3)
    constraint = CONSTRAINTS["schema"]
    prompt = [random.Random(seed).randrange(EOS) for _ in range(9)]
    expected = brute_masked_greedy(lm, constraint, prompt, 80)
    oracle = NoisyOracle(expected, len(prompt), seed, 300)
    gen = SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=16), max_draft=16)
    result = gen.generate(prompt, max_new_tokens=80, constraint=constraint)
    assert_same_or_tie(lm, prompt, expected, result.token_ids)
    assert any(0 < n < 16 for n in oracle.accepted) and max(oracle.accepted) >= 3


class CheckingGrammar(Grammar):
    """Checks every verified draft against fresh matchers before its masks are computed."""

    lm: LoadedModel
    verified = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.accepted: list[int] = []

    def advance(self, tokens: Sequence[int]) -> None:
        super().advance(tokens)
        self.accepted += [t for t in tokens if t != EOS]

    def allowed(self, drafted: Sequence[int]) -> torch.Tensor:
        for j, token in enumerate(drafted):
            assert fresh_mask(self.lm, self.constraint, self.accepted + list(drafted[:j]))[token], "impossible token verified"
        CheckingGrammar.verified += len(drafted)
        return super().allowed(drafted)


def test_no_impossible_token_is_ever_verified(monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_model(257, 4)
    constraint = CONSTRAINTS["schema"]
    CheckingGrammar.lm, CheckingGrammar.verified = lm, 0
    monkeypatch.setattr("ragspec.decoding.generator.Grammar", CheckingGrammar)
    expected = brute_masked_greedy(lm, constraint, [1, 2, 3], 60)
    oracle = NoisyOracle(expected, 3, 0, 257)
    oracle.rng.random = lambda: 0.3 * random.random()  # type: ignore[method-assign]  # corrupt ~half the tokens
    gen = SpeculativeGenerator(lm, drafter=oracle, policy=FixedPolicy(k=8))
    result = gen.generate([1, 2, 3], max_new_tokens=60, constraint=constraint)
    assert result.token_ids == expected
    assert CheckingGrammar.verified > 0 and result.stats.drafted_tokens == CheckingGrammar.verified


@torch.inference_mode()
def test_masks_of_drafted_positions_match_fresh_matchers_and_leave_no_state() -> None:
    lm = tiny_model(257, 1)
    constraint = CONSTRAINTS["schema"]
    grammar = Grammar(constraint, lm.tokenizer, 257, [EOS])
    accepted = lm.tokenizer.encode('{"name": "jo')
    grammar.advance(accepted)
    drafted = lm.tokenizer.encode('e", "age": 7')
    assert grammar.cut(Draft(tuple(drafted), DraftSource.PASSAGE)).tokens == tuple(drafted)
    before = grammar.allowed(())
    masks = grammar.allowed(drafted)
    for j in range(len(drafted) + 1):
        assert torch.equal(masks[j], fresh_mask(lm, constraint, accepted + drafted[:j])), j
    assert torch.equal(grammar.allowed(()), before)  # rolled back to the accepted tokens
    # A cut keeps the valid prefix only; forced tokens follow a value that the grammar closes.
    bad = lm.tokenizer.encode('e", "agx')
    assert grammar.cut(Draft(tuple(bad), DraftSource.PASSAGE)).tokens == tuple(lm.tokenizer.encode('e", "ag'))
    closed = grammar.extend(Draft(tuple(lm.tokenizer.encode('e"')), DraftSource.PASSAGE), 32)
    assert lm.tokenizer.decode(closed.tokens) == 'e", "age": ' and closed.forced == len(', "age": ')


def test_sampled_draft_cut_keeps_the_rejected_tokens_distribution() -> None:
    lm = tiny_model(257, 1)
    grammar = Grammar(CONSTRAINTS["regex"], lm.tokenizer, 257, [EOS])
    tokens = tuple(lm.tokenizer.encode("yes: ab!"))  # "!" is impossible inside the sentence
    probs = torch.full((len(tokens), 257), 1 / 257)
    cut = grammar.cut(Draft(tokens, DraftSource.MODEL, probs=probs))
    assert cut.tokens == tokens[:-1] and cut.probs is not None and cut.probs.shape[0] == len(tokens)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_adaptive_policy_and_forced_tokens_in_stats(temperature: float) -> None:
    lm = tiny_model(257, 2)
    gen = SpeculativeGenerator(lm, policy=AdaptivePolicy(max_draft=8), max_draft=8)
    result = gen.generate([5, 6, 7], max_new_tokens=60, constraint=CONSTRAINTS["schema"], temperature=temperature, seed=3)
    forced = result.stats.by_source["grammar"]
    assert forced.drafted >= forced.accepted > 0
    assert result.stats.masks >= result.stats.forward_passes and result.stats.mask_s > 0
    assert result.stats.as_dict()["masks"] == result.stats.masks


# -- errors before any generation ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Constraint.json_schema({"type": "strin"}), "Invalid type"),
        (lambda: Constraint.json_schema({"type": "integer", "minimum": 5, "maximum": 3}), "Unsatisfiable"),
        (lambda: Constraint.json_schema({"$ref": "#/defs/missing"}), "does not exist"),
        (lambda: Constraint.json_schema("{not json"), "not valid JSON"),
        (lambda: Constraint.json_schema([1, 2]), "must be a JSON object"),
        (lambda: Constraint.json_schema({"type": "string", "format": "no-such-format"}), "format"),
        (lambda: Constraint.regex("a[b"), "unclosed character class"),
        (lambda: Constraint.lark('start: "a" )'), "expecting"),
    ],
)
def test_invalid_or_unsupported_constraints_are_clear_errors(build, message: str) -> None:
    with pytest.raises(ConstraintError, match=message):
        build()


def test_constraint_errors_come_before_any_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_model(257, 0)
    gen = SpeculativeGenerator(lm)
    calls = []
    monkeypatch.setattr(gen.backend, "forward", lambda *a, **k: calls.append(a))
    # A special token this tokenizer does not have: only the tokenizer can tell.
    with pytest.raises(ConstraintError, match="cannot be used"):
        gen.stream([1, 2], constraint=Constraint.lark("start: <|im_start|> /a+/"))
    with pytest.raises(GenerationConfigError, match="constraint must be a ragspec"):
        gen.stream([1, 2], constraint={"type": "object"})
    assert not calls


def test_a_grammar_that_allows_nothing_is_an_error() -> None:
    lm = tiny_model(257, 0)
    # Token id 300 does not exist in a 257-token vocabulary: nothing can ever be produced.
    with pytest.raises(ConstraintError):
        Grammar(Constraint.lark("start: <[300]>"), lm.tokenizer, 257, [EOS])


def test_constraint_travels_in_the_config() -> None:
    constraint = Constraint.regex("a+")
    config = GenerationConfig().merged(constraint=constraint)
    assert config.constraint is constraint and GenerationConfig().constraint is None


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_default_model_constrained_speculation_equals_constrained_plain() -> None:
    """The real model on an extraction from a passage: the same tokens, fewer forwards, and the
    grammar's forced tokens drafted. No history of earlier answers: the speculative run would
    otherwise copy the plain run's answer whole, and what the grammar drafts would depend on it."""
    from ragspec import registry

    gen = SpeculativeGenerator(registry.get_generator("default").target, drafter=NgramDrafter(history_tokens=0))
    passage = ("The Kestrel Lane cooperative was founded in 1987. Every member owns exactly one share, "
               "bought for 250 pounds, and the general meeting is held each March.")
    schema = {"type": "object", "properties": {"founded": {"type": "integer"}, "share_price": {"type": "string", "maxLength": 60},
              "meeting": {"enum": ["January", "March", "June"]}, "summary": {"type": "string", "maxLength": 160}},
              "required": ["founded", "share_price", "meeting", "summary"], "additionalProperties": False}
    text = gen.target.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{passage}\n\nExtract the facts as JSON."}], tokenize=False, add_generation_prompt=True)
    prompt = gen.target.tokenizer.encode(text, add_special_tokens=False)
    constraint = Constraint.json_schema(schema)
    plain = gen.generate(prompt, max_new_tokens=120, speculation=False, constraint=constraint)
    spec = gen.generate(prompt, references=[passage], max_new_tokens=120, constraint=constraint)
    assert spec.token_ids == plain.token_ids, (plain.text, spec.text)
    value = json.loads(spec.text)
    assert set(value) == set(schema["required"]) and value["meeting"] in ("January", "March", "June")
    assert spec.stats.forward_passes < plain.stats.forward_passes and spec.stats.by_source["grammar"].accepted > 5


@torch.inference_mode()
@pytest.mark.parametrize("kind", ["tool_calls", "schema"])
def test_a_draft_that_ends_the_output_leaves_the_grammar_where_it_was(kind: str) -> None:
    """A drafted EOS is never consumed while masks are computed: llguidance does not record an EOS
    it scans as a token, so rolling it back undid one accepted token too many (found in CI, where a
    copied ``...</tool_call><|im_end|>`` draft made the next step accept a token the grammar rejects)."""
    lm = tiny_model(257, 1)
    tool = Tool("add", "Adds two integers.", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    constraint = tool_call_constraint([tool], "any") if kind == "tool_calls" else CONSTRAINTS["schema"]
    text = '<tool_call>[{"name": "add", "arguments": {"a": 1' if kind == "tool_calls" else '{"name": "jo", "age": 1'
    tail = "}}]</tool_call>" if kind == "tool_calls" else ', "role": "author", "active": true, "tags": []}'
    grammar = Grammar(constraint, lm.tokenizer, 257, [EOS])
    accepted = lm.tokenizer.encode(text)
    grammar.advance(accepted)
    before = grammar.allowed(())
    drafted = [*lm.tokenizer.encode(tail), EOS, *lm.tokenizer.encode("xy")]
    cut = grammar.cut(Draft(tuple(drafted), DraftSource.PASSAGE))
    assert cut.tokens == tuple(drafted[: len(tail) + 1])  # nothing is drafted after the EOS
    masks = grammar.allowed(cut.tokens)
    for j in range(len(tail) + 1):
        assert torch.equal(masks[j], fresh_mask(lm, constraint, accepted + drafted[:j])), j
    assert masks[-1].nonzero().flatten().tolist() == [EOS]
    assert grammar.extend(cut, 32) == cut
    assert torch.equal(grammar.allowed(()), before)
    grammar.advance(lm.tokenizer.encode("2"))  # the accepted state is intact: a digit may follow


def test_a_schema_nested_too_deeply_is_a_constraint_error() -> None:
    schema: dict = {"type": "integer"}
    for _ in range(300):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    with pytest.raises(ConstraintError, match="invalid or unsupported JSON Schema"):
        Constraint.json_schema(schema)


@pytest.mark.parametrize("kind", ["schema", "lark"])
def test_an_output_whose_grammar_completes_at_the_budget_ends_as_eos_not_length(kind: str) -> None:
    """A client reading ``finish_reason`` ("length": cut short) must not reject a complete object
    that happened to fill ``max_new_tokens`` exactly."""
    generator = SpeculativeGenerator(tiny_model(257, 3))
    config = GenerationConfig(max_new_tokens=200, constraint=CONSTRAINTS[kind])
    whole = generator.generate("x", config)
    assert whole.finish_reason == "eos"
    n = len(whole.token_ids)
    exact = generator.generate("x", config.merged(max_new_tokens=n))
    assert (exact.token_ids, exact.finish_reason) == (whole.token_ids, "eos")
    short = generator.generate("x", config.merged(max_new_tokens=n - 1))
    assert (short.token_ids, short.finish_reason) == (whole.token_ids[: n - 1], "length")


SELF = {"$ref": "#"}
NODE = {"$ref": "#/$defs/node"}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": SELF}, "required": ["a"]},
        {"type": "object", "properties": {"a": NODE}, "required": ["a"],
         "$defs": {"node": {"type": "object", "properties": {"next": NODE}, "required": ["next"]}}},
        {"type": "object", "properties": {"a": {"anyOf": [SELF, {"allOf": [SELF]}]}}, "required": ["a"]},
        {"type": "object", "properties": {"a": {"type": "array", "items": SELF, "minItems": 1}}, "required": ["a"]},
    ],
)
def test_a_schema_that_requires_itself_is_refused_when_built_not_deep_in_generation(schema: dict) -> None:
    """The third probe: llguidance compiled these, then hit its 50,000-item limit while decoding."""
    with pytest.raises(ConstraintError, match="no finite JSON matches"):
        Constraint.json_schema(schema)
    with pytest.raises(ValueError, match="no finite JSON matches the parameters of tool 'w'"):
        tool_call_constraint([Tool("w", "walks the tree", schema)], "w")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": SELF}},  # optional: {} ends it
        {"type": "object", "properties": {"a": {"anyOf": [SELF, {"type": "null"}]}}, "required": ["a"]},
        {"type": "object", "properties": {"a": {"type": "array", "items": SELF}}, "required": ["a"]},  # [] ends it
        {"type": "object", "properties": {"a": {"allOf": [{"anyOf": [{"type": "integer"}, SELF]}]}}, "required": ["a"]},
    ],
)
def test_recursive_schemas_with_a_finite_instance_are_kept(schema: dict) -> None:
    assert Constraint.json_schema(schema).kind == "json_schema"
    assert tool_call_constraint([Tool("w", "walks the tree", schema)], "w").kind == "lark"


def test_a_tool_choice_whose_function_is_not_an_object_is_a_tool_error() -> None:
    from ragspec.engine.tool_calls import ToolError, parse_choice

    tools = [Tool("w", "walks")]
    for choice in ({"type": "function", "function": "w"}, {"type": "function", "function": ["w"]}, {"type": "function"}):
        with pytest.raises(ToolError, match="is not"):
            parse_choice(choice, tools)
    assert parse_choice({"type": "function", "function": {"name": "w"}}, tools) == "w"
