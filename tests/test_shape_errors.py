"""The hidden-state shape error, worded once: the Python package says exactly what tests/fixtures/shape_errors.json
holds, which contract/shape_contract_test.cc holds the C++ CheckHiddenShape to as well."""
import json

import pytest

from conftest import ROOT
from dflash_launch import HiddenStateContractError, check_hidden_shape, check_hidden_states, describe_violation
from dflash_launch import spool

CASES = json.loads((ROOT / "tests" / "fixtures" / "shape_errors.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_check_hidden_shape_words_each_case_as_the_fixture(case):
    c = case["contract"]
    got = check_hidden_shape(c["batch"], c["seq_len"], c["n_taps"], c["hidden"], case["shape"])
    if case["violation"] is None:
        assert got is None
        return
    v = case["violation"]
    assert got == (v["message"], v["expected"], v["found"], v["fix"])
    assert describe_violation(got) == case["text"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_check_hidden_states_raises_the_same_text_for_a_tensor(case):
    torch = pytest.importorskip("torch")
    c = case["contract"]
    t = torch.empty(case["shape"], device="meta")  # the shape without the memory (a [1, 2000, 5, 5120] is 200 MB)
    if case["violation"] is None:
        assert check_hidden_states(t, c["n_taps"], c["hidden"], c["batch"], c["seq_len"]) is t
        return
    with pytest.raises(HiddenStateContractError) as e:
        check_hidden_states(t, c["n_taps"], c["hidden"], c["batch"], c["seq_len"])
    assert str(e.value) == case["text"]


def test_the_spool_uses_the_one_check():
    assert spool.check_hidden_shape is check_hidden_shape
