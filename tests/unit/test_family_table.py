"""The family table names each bridge by path (imported when used: tests/integration/test_entry_points.py)."""

from __future__ import annotations

from slime_like.trainer.megatron.families import FAMILIES


def test_every_family_names_a_bridge_class() -> None:
    from mbridge.core import Bridge

    for model_type, family in FAMILIES.items():
        assert issubclass(family.bridge, Bridge), (model_type, family.bridge_path)
