"""The secure-sum modes' registry (`dpfl.secure.MODES`): every deployable mode has its
deployed halves in the Flower engine, and a mode's facts agree with what its sums show the
server (`tests/test_registry_names.py` checks that nothing else picks a mode by name)."""

from __future__ import annotations

import pytest

from dpfl.engines.flower.protocol import DeploymentError
from dpfl.engines.flower.sums import deployed, every_deployed
from dpfl.secure import MODES


def test_every_deployable_mode_has_its_deployed_halves_and_no_other_has() -> None:
    halves = every_deployed()
    assert [h.mode.name for h in halves] == [n for n, m in MODES.items() if m.deployable]
    assert all(h.mode is MODES[h.mode.name] for h in halves)
    for name in (n for n, m in MODES.items() if not m.deployable):
        with pytest.raises(DeploymentError, match="not deployable"):
            deployed(name)


def test_a_modes_facts_agree_with_its_sums() -> None:
    """What a mode says of the server agrees with what its sums show it."""
    for mode in MODES.values():
        assert mode.sum().reveals_inputs is not mode.hides_replies, mode.name
        assert mode.stats_sum().reveals_inputs is not mode.hides_replies, mode.name
