"""Speculative sampling has the distribution of plain sampling: exact enumeration vs many runs."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence

import pytest
import torch
from scipy.stats import chi2

from ragspec.engine.drafting import Draft, DraftSource
from ragspec.decoding.generator import SpeculativeGenerator
from ragspec.backends.pytorch.loading import LoadedModel
from ragspec.engine.policy import FixedPolicy
from ragspec.engine.config import GenerationConfig
from ragspec.engine.sampling import warp

from ragspec.engine.constraints import Constraint

from tests.ragspec.engine.test_constrained import fresh_mask
from tests.ragspec.engine.test_penalties import reference_penalties
from tests.ragspec.tiny import EOS, tiny_model

# Each chi-square test below fails by chance with probability ALPHA when the sampler is exact.
ALPHA = 1e-3
RUNS = 2000
PROMPT = [11, 42, 7, 99]


@torch.inference_mode()
def output_distribution(
    next_logits: Callable[[tuple[int, ...]], torch.Tensor],
    params: GenerationConfig,
    n: int,
    mask: Callable[[tuple[int, ...]], torch.Tensor] | None = None,
) -> dict[tuple[int, ...], float]:
    """Probability of every output of at most ``n`` tokens under plain sampling, by enumeration;
    ``next_logits(output so far)`` are the model's ``[1, V]`` logits after ``PROMPT`` and it.

    Sampling EOS ends an output early (EOS itself is not returned). Penalties apply first (the
    brute-force reference, from the output so far), then ``mask(output so far)`` where one is given
    (a constraint's), then the warp.
    """
    dist: dict[tuple[int, ...], float] = {(): 1.0}
    for step in range(n):
        nxt: dict[tuple[int, ...], float] = {}
        for seq, prob in dist.items():
            if len(seq) < step:  # ended by EOS
                nxt[seq] = nxt.get(seq, 0.0) + prob
                continue
            logits = next_logits(seq)
            if params.penalized:
                logits = reference_penalties(logits[0], seq, params)[None]
            if mask is not None:
                logits = logits.masked_fill(~mask(seq), float("-inf"))
            p = warp(logits, params)[0]
            for t in p.nonzero().flatten().tolist():
                out = seq if t == EOS else seq + (t,)
                nxt[out] = nxt.get(out, 0.0) + prob * float(p[t])
        dist = nxt
    return dist


def exact_distribution(lm: LoadedModel, params: GenerationConfig, n: int) -> dict[tuple[int, ...], float]:
    """``output_distribution`` of the PyTorch model, under ``params``' constraint (a fresh matcher fed the whole output)."""
    constraint = params.constraint
    return output_distribution(
        lambda seq: lm.model(torch.tensor([PROMPT + list(seq)])).logits[0, -1:],
        params,
        n,
        None if constraint is None else lambda seq: fresh_mask(lm, constraint, seq),
    )


def chi_square_pvalue(counts: Counter, expected: dict[tuple[int, ...], float], runs: int) -> float:
    """Pearson's test, pooling cells with fewer than 5 expected draws into one."""
    assert set(counts) <= set(expected), f"impossible sequences drawn: {set(counts) - set(expected)}"
    stat, dof, pool_obs, pool_exp = 0.0, -1, 0, 0.0
    for seq, prob in expected.items():
        if prob * runs < 5:
            pool_obs, pool_exp = pool_obs + counts[seq], pool_exp + prob * runs
            continue
        stat += (counts[seq] - prob * runs) ** 2 / (prob * runs)
        dof += 1
    if pool_exp > 0:
        stat += (pool_obs - pool_exp) ** 2 / pool_exp
        dof += 1
    return float(chi2.sf(stat, dof))


class FixedDrafter:
    """Always proposes the same tokens: a deterministic (one-hot) draft like an n-gram copy."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = tuple(tokens)

    def begin(self, prompt: Sequence[int], references: Sequence[Sequence[int]]) -> None: ...
    def feedback(self, draft: Draft, n_accepted: int) -> None: ...
    def finish(self, output: Sequence[int]) -> None: ...

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft | None:
        return Draft(self.tokens[:max_tokens], DraftSource.PROMPT, match_length=3)


class RandomModelDrafter:
    """Samples each drafted token from a fixed distribution ``q`` and reports it, like a draft model."""

    def __init__(self, q: torch.Tensor, seed: int = 0) -> None:
        self.q = q
        self.rng = torch.Generator().manual_seed(seed)

    def begin(self, prompt: Sequence[int], references: Sequence[Sequence[int]]) -> None: ...
    def feedback(self, draft: Draft, n_accepted: int) -> None: ...
    def finish(self, output: Sequence[int]) -> None: ...

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft | None:
        if max_tokens <= 0:
            return None
        tokens = torch.multinomial(self.q, max_tokens, replacement=True, generator=self.rng).tolist()
        return Draft(tuple(tokens), DraftSource.MODEL, probs=self.q.expand(max_tokens, -1))


def sample_counts(lm: LoadedModel, params: GenerationConfig, drafter: object | None, n: int, runs: int = RUNS) -> Counter:
    gen = SpeculativeGenerator(lm, drafter=drafter, policy=FixedPolicy(k=n - 1, min_match=0))
    counts: Counter = Counter()
    for seed in range(runs):
        config = params.merged(max_new_tokens=n, speculation=drafter is not None, seed=seed)
        result = gen.generate(PROMPT, config)
        counts[tuple(result.token_ids)] += 1
    return counts


@pytest.fixture(scope="module")
def lm() -> LoadedModel:
    return tiny_model(257, 9, layers=1)


CASES = {
    "top_k": GenerationConfig(temperature=1.3, top_k=4),
    "top_p": GenerationConfig(temperature=0.9, top_p=0.7),
    # Row 2 of the verify forward sees the drafted token before it: a wrong history shows here.
    "penalties": GenerationConfig(temperature=1.3, top_k=4, presence_penalty=1.5, frequency_penalty=0.5,
                                  repeat_penalty=1.6, repeat_last_n=2),
}


def test_the_penalised_reference_differs_from_the_unpenalised_one(lm: LoadedModel) -> None:
    """Else the penalised chi-square tests below could not see penalties applied wrongly."""
    penalised = exact_distribution(lm, CASES["penalties"], 3)
    plain = exact_distribution(lm, CASES["top_k"], 3)
    assert sum(abs(penalised.get(s, 0.0) - plain.get(s, 0.0)) for s in set(penalised) | set(plain)) > 0.3


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("kind", "case"), [("plain", "top_k"), ("ngram", "top_k"), ("model", "top_k"),
                                            ("ngram", "top_p"), ("model", "top_p"),
                                            ("ngram", "penalties"), ("model", "penalties")])
def test_speculative_sampling_matches_plain_sampling(lm: LoadedModel, case: str, kind: str) -> None:
    params = CASES[case]
    n = 3  # the first token comes from the prefill, the next two from one verified 2-token draft
    expected = exact_distribution(lm, params, n)
    support = sorted({t for seq in expected for t in seq})
    if kind == "plain":
        drafter = None
    elif kind == "ngram":
        # Plausible but often wrong tokens: both acceptance and the residual draw get exercised.
        drafter = FixedDrafter([support[0], support[-1]])
    else:
        q = torch.zeros(257)
        q[support] = torch.linspace(1.0, 3.0, len(support))
        q[200] = 1.0  # mass outside the target's support must always be rejected
        drafter = RandomModelDrafter(q / q.sum())
    counts = sample_counts(lm, params, drafter, n)
    pvalue = chi_square_pvalue(counts, expected, RUNS)
    assert pvalue > ALPHA, f"{kind}/{case}: sampled distribution differs from the target's (p={pvalue:.2e})"


# After one of a-d, "xy" or "z" then one of e-h: "y" after "x" is forced (drafted by the grammar),
# and EOS is the only token after the third character.
PATTERN = Constraint.regex("[a-d](xy|z[e-h])")
CONSTRAINED_RUNS = 1000  # at most 20 possible outputs: enough draws per cell for the test's power
CONSTRAINED_CASES = {  # warmer than CASES: the masked distribution must keep several outputs
    "top_k": GenerationConfig(temperature=1.3, top_k=2, constraint=PATTERN),
    "top_p": GenerationConfig(temperature=2.0, top_p=0.9, constraint=PATTERN),
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("kind", "case"), [("plain", "top_k"), ("ngram", "top_p"), ("model", "top_k")])
def test_constrained_speculative_sampling_matches_masked_plain_sampling(lm: LoadedModel, case: str, kind: str) -> None:
    """The reference is plain sampling from the masked, renormalised, then warped distribution."""
    params = CONSTRAINED_CASES[case]
    n = 3
    expected = exact_distribution(lm, params, n)
    assert sum(p * CONSTRAINED_RUNS >= 5 for p in expected.values()) >= 4, "too few outputs for the test to say anything"
    ids = {c: lm.tokenizer.convert_tokens_to_ids(c) for c in "abxyzefq"}
    if kind == "plain":
        drafter = None
    elif kind == "ngram":
        # "x", "y" are possible after the first character, "e" never after "xy": cut before verifying.
        drafter = FixedDrafter([ids["x"], ids["y"], ids["e"]])
    else:
        q = torch.zeros(257)
        for c, w in zip("xyzefqa", (3.0, 1.0, 2.0, 1.0, 1.0, 2.0, 1.0)):  # "q" and "a" are never allowed there
            q[ids[c]] = w
        drafter = RandomModelDrafter(q / q.sum())
    counts = sample_counts(lm, params, drafter, n, runs=CONSTRAINED_RUNS)
    assert all(len(seq) == 3 for seq in counts), "every sample is a complete match of the pattern"
    pvalue = chi_square_pvalue(counts, expected, CONSTRAINED_RUNS)
    assert pvalue > ALPHA, f"{kind}/{case}: constrained sampling differs from masked plain sampling (p={pvalue:.2e})"


def test_warp_matches_a_brute_force_filter() -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    for params in [GenerationConfig(temperature=0.7, top_k=5), GenerationConfig(temperature=1.0, top_p=0.6), GenerationConfig(temperature=1.7, top_k=8, top_p=0.3)]:
        probs = warp(logits, params)
        for row, p in zip(logits, probs):
            ranked = sorted(range(50), key=lambda i: -float(row[i]))
            keep = ranked[: params.top_k or 50]
            mass = (row[keep] / params.temperature).softmax(-1)
            kept, total = [], 0.0
            for i, m in zip(keep, mass.tolist()):
                if total >= params.top_p:
                    break
                kept.append(i)
                total += m
            want = torch.zeros(50)
            want[kept] = (row[kept] / params.temperature).softmax(-1)
            torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-6)


def test_greedy_config_and_validation() -> None:
    assert GenerationConfig().greedy and not GenerationConfig(temperature=0.5).greedy
    for bad in [dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)]:
        with pytest.raises(ValueError):
            GenerationConfig(**bad)


def test_seeded_sampling_is_reproducible(lm: LoadedModel) -> None:
    # Plain sampling: the seed fixes the sample.
    gen = SpeculativeGenerator(lm)
    a = gen.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=5, speculation=False).token_ids
    b = gen.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=5, speculation=False).token_ids
    c = [gen.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=s, speculation=False).token_ids
         for s in range(6, 10)]
    assert a == b and any(x != a for x in c)
    # Speculative sampling draws as many random numbers as its drafts need, so the sample for a
    # seed is fixed only for the same drafts: same fixed policy and drafter state.
    spec = [SpeculativeGenerator(lm, policy=FixedPolicy(k=3)).generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=5)
            for _ in range(2)]
    assert spec[0].token_ids == spec[1].token_ids
