"""Paired bootstrap against the base run: clear and unclear differences, and the per-seed sweep table."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from rpr_mt.errors import UserError
from rpr_mt.experiments.significance import (
    ALPHA, Claim, paired_bootstrap, paper_claim, render_significance_table, verdict, verdict_rule,
)
from rpr_mt.experiments.tables import load_sweep, mean_std
from tests.experiments.test_lengths import sweep_with_hypotheses

WORDS = "ein hund eine katze der mann die frau spielt läuft auf dem gras im park mit einem ball".split()


def _corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12))) for _ in range(n)]


def test_a_clearly_better_system_is_significant_and_a_near_copy_is_not():
    references = _corpus(200)
    garbled = _corpus(200, seed=1)  # unrelated sentences from the same words
    good = [r if i % 4 else g for i, (r, g) in enumerate(zip(references, garbled))]  # 3 in 4 exact
    delta, p = paired_bootstrap(garbled, good, references)
    assert delta > 30 and p < 0.01
    # The same system with one sentence swapped: a small difference, well within resampling noise.
    near = list(good)
    near[1] = garbled[1]
    delta, p = paired_bootstrap(good, near, references)
    assert -2 < delta < 0 and p > 0.05
    with pytest.raises(UserError, match="line-aligned"):
        paired_bootstrap(good, near[:-1], references)


@pytest.mark.parametrize("metric", ["sacrebleu", "lit"])
def test_a_system_against_itself_is_no_difference_p_1(metric):
    """sacreBLEU's p for identical outputs is its minimum, 1 / 1001 (multeval's convention): a table showed
    '+0.00, p = 0.001' for two runs that translated alike."""
    references = _corpus(100)
    system = [r if i % 3 else "ein hund" for i, r in enumerate(references)]
    assert paired_bootstrap(system, list(system), references, metric=metric) == (0.0, 1.0)


def test_table_compares_each_seed_with_its_own_base_run(tmp_path):
    data = sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    table = render_significance_table(load_sweep(tmp_path / "sweep"), "dev", data_dir=tmp_path / "data", n_samples=200)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
    assert rows["relative = k=16"] == "| relative = k=16 | 2 | base | | | |"
    # absolute/seed1 is compared with base/seed1 only (there is no absolute/seed2). The paper's Table 1 puts absolute
    # 0.3 below relative (26.5 and 26.8 En-De): one seed below relative bears that claim out if its p is small.
    delta, p = paired_bootstrap(data["base/seed1"], data["positions=absolute/seed1"], data["references"], 200)
    assert delta < 0
    said = "holds (1 seed)" if p < ALPHA else "within noise (1 seed)"
    assert rows["absolute"] == f"| absolute | 1 | {mean_std([delta])} | {p:.3f} (seed 1) | below base (-0.3) | {said} |"
    assert table.splitlines()[0].endswith("| paper (En-De) | verdict |")
    assert f"significant when its p < {ALPHA}" in table.splitlines()[-1]  # the rule, under the table
    assert "k=0" not in rows  # not finished


def test_cells_without_a_base_run_of_their_seed_are_not_compared(tmp_path):
    sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    plan_path = tmp_path / "sweep" / "plan.json"
    plan = json.loads(plan_path.read_text())
    plan["runs"]["positions=absolute/seed1"]["seed"] = 3  # as if it had been seed 3, which has no base run
    plan_path.write_text(json.dumps(plan))
    result_path = tmp_path / "sweep" / "positions=absolute" / "seed1" / "result.json"  # its result says so too
    result_path.write_text(json.dumps({**json.loads(result_path.read_text()), "seed": 3}))
    table = render_significance_table(load_sweep(tmp_path / "sweep"), "dev", data_dir=tmp_path / "data", n_samples=50)
    assert "| absolute | 0 | – | – | below base (-0.3) | – |" in table
    # No base run: said in the report (whose tables and plots are still wanted), not an error that drops them all
    (tmp_path / "sweep" / "base" / "seed1" / "result.json").rename(tmp_path / "result1.json")
    (tmp_path / "sweep" / "base" / "seed2" / "result.json").rename(tmp_path / "result2.json")
    table = render_significance_table(load_sweep(tmp_path / "sweep"), "dev", data_dir=tmp_path / "data", n_samples=50)
    assert table == ("Not computed: the base run (the config without overrides) has not finished yet (base/seed1, "
                     "base/seed2).")
    for run in ("base/seed1", "base/seed2"):
        plan["runs"][run]["overrides"] = ["model.clip=4"]
    plan_path.write_text(json.dumps(plan))
    table = render_significance_table(load_sweep(tmp_path / "sweep"), "dev", data_dir=tmp_path / "data", n_samples=50)
    assert table.startswith("Not computed: no run of this sweep is the base config without overrides")


def test_signed_mean_of_deltas():
    from rpr_mt.experiments.significance import _signed

    assert _signed([0.5, 1.5]) == f"+1.00 ± {statistics.stdev([0.5, 1.5]):.2f}"
    assert _signed([-0.25]) == "-0.25" and _signed([]) == "–"


def test_literature_bleu_bootstrap_resamples_lowercased_tokenized_text(tmp_path):
    """--metric lit: raw runs' outputs go through the literature's lowercase + normalize + tokenize first; runs on
    Multi30k's tokenized text are resampled as they are; runs scored before the metric existed are refused."""
    from rpr_mt.text.multi30k import lowercase_normalize_tokenize
    from rpr_mt.experiments.significance import _signed

    data = sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    data["base/seed1"] = [line.upper() for line in data["base/seed1"]]  # the same words, if case does not count
    (tmp_path / "sweep" / "base/seed1/dev.hyp").write_text("\n".join(data["base/seed1"]) + "\n")
    results = sorted((tmp_path / "sweep").glob("*/seed*/result.json"))
    with pytest.raises(UserError, match="lc_tok_signature"):
        render_significance_table(load_sweep(tmp_path / "sweep"), "dev", data_dir=tmp_path / "data", n_samples=50,
                                  metric="lit")
    for prep in ("lc.norm.tok", "pretokenized"):
        for path in results:
            record = json.loads(path.read_text())
            path.write_text(json.dumps({**record, "lc_tok_signature": f"nrefs:1|tok:none|prep:{prep}"}))
        table = render_significance_table(load_sweep(tmp_path / "sweep"), "dev", data_dir=tmp_path / "data",
                                          n_samples=200, metric="lit")
        assert "literature BLEU (lc.norm.tok) vs base" in table.splitlines()[0]
        base, system, refs = (data[k] for k in ("base/seed1", "positions=absolute/seed1", "references"))
        if prep == "lc.norm.tok":
            base, system, refs = (lowercase_normalize_tokenize(x, "de") for x in (base, system, refs))
        delta, p = paired_bootstrap(base, system, refs, 200, "lit")
        assert f"| absolute | 1 | {_signed([delta])} | {p:.3f} (seed 1) | below base (-0.3) |" in table
        # lowercased, the upper-case base run is perfect and absolute is behind it; as it is, base scores nothing
        assert (delta < 0) == (prep == "lc.norm.tok")


def test_baseline_cell_is_compared_with_instead_of_the_base_run(tmp_path):
    """A sweep whose base run is not planned (--tables clip with a base k that is none of the paper's; a schemes
    sweep) had nothing to compare with: --baseline names the cell to compare the others with, as the study's does."""
    data = sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    sweep = load_sweep(tmp_path / "sweep")
    table = render_significance_table(sweep, "dev", data_dir=tmp_path / "data", n_samples=200, baseline="absolute")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
    assert "vs absolute" in table.splitlines()[0]
    assert rows["absolute"] == "| absolute | 1 | base | | | |"
    delta, p = paired_bootstrap(data["positions=absolute/seed1"], data["base/seed1"], data["references"], 200)
    # against absolute, the paper's claim turns round: relative is 0.3 above it (k=16 has no paper figure against a
    # Table 1 cell, so the row's claim is relative's)
    said = "holds (1 seed)" if p < ALPHA else "within noise (1 seed)"
    assert rows["relative = k=16"] == (f"| relative = k=16 | 1 | +{mean_std([delta])} | {p:.3f} (seed 1) "
                                       f"| above absolute (+0.3) | {said} |")  # no seed 2
    assert render_significance_table(sweep, "dev", baseline="k=0") == (
        "Not computed: the 'k=0' run has not finished yet (clip=0/seed1).")  # and no data is read for it
    with pytest.raises(UserError, match=r"--baseline 'k=3' is not a cell of the sweep under .*\(its cells: relative, "):
        render_significance_table(sweep, "dev", data_dir=tmp_path / "data", baseline="k=3")


def test_nothing_finished_is_said_without_reading_any_data(tmp_path):
    sweep_with_hypotheses(tmp_path / "sweep", tmp_path / "data")
    for result in (tmp_path / "sweep").glob("*/*/result.json"):
        result.unlink()
    table = render_significance_table(load_sweep(tmp_path / "sweep"), "dev", data_dir=tmp_path / "nowhere")
    assert table.startswith("Not computed: the base run (the config without overrides) has not finished yet")


def test_paper_claims_come_from_the_paper_s_en_de_numbers_within_one_table():
    """Each cell against the comparison row, in the same table: below, level (|Δ| < 0.2) or above; none across
    tables (Table 1 is test, Tables 2 and 3 dev) or without a paper figure."""
    base = ["relative", "k=16", "aV+aK"]
    assert paper_claim(["k=0"], base) == Claim(-13.3) and Claim(-13.3).kind == "below"
    assert paper_claim(["absolute"], base).describe("base") == "below base (-0.3)"
    assert paper_claim(["aV only"], base).kind == "below" and paper_claim(["k=1"], base).kind == "below"
    for label in ("k=2", "k=4", "k=64", "k=256", "aK only"):
        assert paper_claim([label], base).kind == "level", label
    assert paper_claim(["k=4"], base).describe("base") == "level with base (+0.1)"
    assert paper_claim(["relative", "k=16"], ["absolute"]).describe("absolute") == "above absolute (+0.3)"
    assert paper_claim(["k=0"], ["absolute"]) is None  # the paper has no k=0 against absolute
    assert paper_claim(["RoPE"], base) is None


def test_a_sweep_into_french_takes_table_1_s_claim_from_the_paper_s_en_fr_numbers():
    """An En->Fr Table 1 was read against the paper's En-De gain (-0.3) while its En-Fr one is -0.5 (38.2 against
    38.7); Tables 2 and 3 have only En-De numbers, which stay."""
    base = ["relative", "k=16", "aV+aK"]
    assert paper_claim(["absolute"], base, "fr").describe("base") == "below base (-0.5)"
    assert paper_claim(["absolute"], base, "de").describe("base") == "below base (-0.3)"
    assert paper_claim(["k=0"], base, "fr") == Claim(-13.3)
    assert "En-Fr BLEU" in verdict_rule("the base run", "fr") and "En-De BLEU" in verdict_rule("the base run")


@pytest.mark.parametrize("kind, deltas, p_values, expected", [
    # below the base: every seed significantly below holds, every seed significantly above does not, else noise
    ("below", [-2.1, -2.5], [0.001, 0.001], "holds"),
    ("below", [0.8, 0.6], [0.01, 0.03], "does not hold"),
    ("below", [-2.1, -0.3], [0.001, 0.2], "within noise"),
    ("below", [-2.1, 0.9], [0.001, 0.001], "within noise"),
    ("below", [-9.9], [0.001], "holds (1 seed)"),
    # above (the same claim seen from an absolute baseline) mirrors it
    ("above", [2.1, 2.5], [0.001, 0.001], "holds"),
    ("above", [-2.1, -2.5], [0.001, 0.001], "does not hold"),
    # level: no seed significant holds, every seed significant one way does not, a mix is noise
    ("level", [0.43, -0.3], [0.152, 0.4], "holds"),
    ("level", [-0.9, -1.2], [0.01, 0.002], "does not hold"),
    ("level", [0.9, 1.2], [0.01, 0.002], "does not hold"),
    ("level", [-0.9, 1.2], [0.01, 0.002], "within noise"),
    ("level", [-0.9, 0.2], [0.01, 0.6], "within noise"),
    ("level", [0.43], [0.152], "holds (1 seed)"),
    ("level", [0.43], [0.01], "does not hold (1 seed)"),
    ("level", [], [], "–"),
])
def test_verdict_of_each_claim(kind, deltas, p_values, expected):
    claim = {"below": Claim(-13.3), "above": Claim(0.3), "level": Claim(0.1)}[kind]
    assert claim.kind == kind
    assert verdict(claim, deltas, p_values) == expected


def test_verdict_p_at_alpha_is_not_significant():
    assert verdict(Claim(-0.3), [-1.0], [ALPHA]) == "within noise (1 seed)"
    assert verdict(Claim(0.0), [-1.0], [ALPHA]) == "holds (1 seed)"
