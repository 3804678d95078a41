"""Which torchft replica group gives way where their settings differ
(torch_mojo.replica_agreement; the groups themselves, refused for real,
are in tests/test_torchft.py), and that the settings it compares are the
ones libmojoccl requires alike."""

import re

from tests.harness import ROOT
from torch_mojo.replica_agreement import MUST_AGREE, ReplicaFacts, facts_here, judge


def facts(replica: str, deterministic: str = "0", quorums: int = 0, ranks: int = 1) -> ReplicaFacts:
    return ReplicaFacts(replica, (("MOJOCCL_DETERMINISTIC", deterministic),
                                  ("the replica group's number of ranks", str(ranks))), quorums)


def test_the_settings_compared_are_those_libmojoccl_requires_alike():
    source = (ROOT / "cpp" / "ccl" / "comm.cc").read_text()
    required = set(re.findall(r'"(MOJOCCL_[A-Z_]+)"', " ".join(
        re.findall(r"(?:agreeOnSettings\(Bootstrap& bootstrap\) \{.*?\};|requireSameSettings\(\{.*?\}\);)", source, re.S))))
    assert required == set(MUST_AGREE) and len(required) == 8


def test_groups_that_agree_pass(monkeypatch):
    monkeypatch.setenv("MOJOCCL_DETERMINISTIC", "1")
    here = facts_here("a:uuid", 2, 3)
    assert here.replica == "a" and ("MOJOCCL_DETERMINISTIC", "1") in here.settings
    assert ("MOJOCCL_ALGO", "auto") in here.settings  # unset: libmojoccl's default
    assert ReplicaFacts.from_json(here.to_json()) == here
    assert judge(here, [here, facts_here("b:uuid", 2, 0)]) is None


def test_torchs_deterministic_switch_is_the_setting_libmojoccl_will_read(monkeypatch):
    import torch

    monkeypatch.setenv("MOJOCCL_DETERMINISTIC", "")  # unset, and put back as it was after the test
    monkeypatch.delenv("MOJOCCL_DETERMINISTIC")
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert ("MOJOCCL_DETERMINISTIC", "1") in facts_here("a", 1, 0).settings
    finally:
        torch.use_deterministic_algorithms(was)


def test_the_majority_stands_and_the_odd_group_ends():
    everyone = [facts("a", quorums=0), facts("b", quorums=0), facts("c", "1", quorums=50)]
    odd = judge(everyone[2], everyone)
    assert odd.refused and odd.message == (
        "torch-mojo: replica group c cannot train with replica groups a, b (MOJOCCL_DETERMINISTIC is 0 in replica "
        "groups a, b and 1 in replica group c): set it alike on every replica group. Replica group c ends; "
        "the others train on.")
    standing = judge(everyone[0], everyone)
    assert not standing.refused and standing.message.startswith("torch-mojo: replica group c cannot train with this")


def test_between_as_many_the_group_there_first_stands():
    first, late = facts("a", quorums=12, ranks=2), facts("b", quorums=0, ranks=3)
    assert judge(late, [first, late]).refused and not judge(first, [first, late]).refused
    assert "number of ranks is 2 in replica group a and 3 in replica group b" in judge(late, [first, late]).message


def test_groups_equally_new_all_end():
    a, b = facts("a"), facts("b", "1")
    for mine in (a, b):
        verdict = judge(mine, [a, b])
        assert verdict.refused and "none has trained longer than the others" in verdict.message
