"""What the replica groups of one torchft job must agree on, and which
group gives way where they do not.

torchft builds a `mojo` group across its replica groups at every quorum
change. Groups started with another value of a setting that libmojoccl
requires alike on every rank (MOJOCCL_DETERMINISTIC, ...), or with
another number of ranks, cannot train together: libmojoccl refuses every
such group, and torchft, which takes a failed configure as a passing
fault, would try again at every step, so that no group trains at all.

So before the group is made each rank publishes these facts in the
quorum's store and reads everyone's. Where they differ, the value held by
the most ranks stands; between as many, the one of the group that has
trained in the most quorums (the one that was there first); between
groups equally new, none. The others' groups are refused: their
processes end with a message that names the setting and the groups, and
the standing groups skip that one quorum and train on without them.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Optional

from torch_mojo._registration import _follow_torch_determinism
from torch_mojo.env import VARIABLES

MUST_AGREE = tuple(variable.name for variable in VARIABLES if variable.must_agree)
WORLD_SIZE = "the replica group's number of ranks"


@dataclass(frozen=True)
class ReplicaFacts:
    replica: str  # torchft's replica id, without the unique suffix it adds
    settings: tuple[tuple[str, str], ...]  # every value that must agree, the group's size among them
    quorums: int  # how many quorums this process has trained in: who was there first

    def to_json(self) -> str:
        return json.dumps({"replica": self.replica, "settings": self.settings, "quorums": self.quorums})

    @staticmethod
    def from_json(text: str | bytes) -> "ReplicaFacts":
        fields = json.loads(text)
        return ReplicaFacts(fields["replica"], tuple(tuple(pair) for pair in fields["settings"]), fields["quorums"])


def facts_here(replica_id: str, group_world_size: int, quorums: int) -> ReplicaFacts:
    """This rank's facts: the settings as libmojoccl will read them (unset: the default)."""
    _follow_torch_determinism()  # as the communicator about to be made will: MOJOCCL_DETERMINISTIC from torch's switch
    defaults = {variable.name: variable.default for variable in VARIABLES}
    settings = [(name, os.environ.get(name) or defaults[name]) for name in MUST_AGREE]
    return ReplicaFacts(replica_id.split(":")[0], (*settings, (WORLD_SIZE, str(group_world_size))), quorums)


@dataclass(frozen=True)
class Verdict:
    refused: bool  # this rank's group gives way: its process ends
    message: str


def judge(mine: ReplicaFacts, everyone: list[ReplicaFacts]) -> Optional[Verdict]:
    """None where every rank agrees; else whether `mine` gives way, and why."""
    held = Counter(facts.settings for facts in everyone)
    if len(held) == 1:
        return None

    def standing(settings):
        return held[settings], max(facts.quorums for facts in everyone if facts.settings == settings)

    ranked = sorted(held, key=standing, reverse=True)
    winner = ranked[0] if standing(ranked[0]) > standing(ranked[1]) else None
    differences = _differences(everyone)
    if winner is None:
        return Verdict(True, f"torch-mojo: the replica groups of this torchft job disagree ({differences}), and "
                             f"none has trained longer than the others to say which is meant: set it alike on "
                             f"every replica group. Replica group {mine.replica} ends.")
    standing_groups = _names(facts.replica for facts in everyone if facts.settings == winner)
    if mine.settings != winner:
        return Verdict(True, f"torch-mojo: replica group {mine.replica} cannot train with {standing_groups} "
                             f"({differences}): set it alike on every replica group. Replica group "
                             f"{mine.replica} ends; the others train on.")
    odd = _names(facts.replica for facts in everyone if facts.settings != winner)
    return Verdict(False, f"torch-mojo: {odd} cannot train with this group ({differences}): refused, it ends; "
                          f"this quorum is skipped.")


def _differences(everyone: list[ReplicaFacts]) -> str:
    """'MOJOCCL_DETERMINISTIC is 1 in replica group b and 0 in replica group a', for each that differs."""
    said = []
    for index, (name, _) in enumerate(everyone[0].settings):
        groups_by_value: dict[str, list[str]] = {}
        for facts in everyone:
            groups_by_value.setdefault(facts.settings[index][1], []).append(facts.replica)
        if len(groups_by_value) > 1:
            said.append(f"{name} is " + " and ".join(f"{value} in {_names(groups)}"
                                                     for value, groups in groups_by_value.items()))
    return "; ".join(said)


def _names(replicas) -> str:
    unique = sorted(set(replicas))
    return ("replica group " if len(unique) == 1 else "replica groups ") + ", ".join(unique)
