"""slime's train-data dict (--custom-convert-samples-to-train-data-path) read into TrainData."""

from __future__ import annotations

import pytest

from rollout.slime_train_data import convert_hook, train_data_from_slime
from slime_like.core.sample import Sample


def groups() -> list[list[Sample]]:
    made = [Sample(index=i, group_index=i // 2, tokens=[1, 2, 3 + i], response_length=1) for i in range(4)]
    made[3].weight_version = 7
    return [made[:2], made[2:]]


def slime_dict(**change: object) -> dict[str, object]:
    data: dict[str, object] = {
        "tokens": [[1, 2, 6], [1, 2, 3]],
        "response_lengths": [1, 1],
        "rewards": [0.5, -0.5],
        "raw_reward": [1.0, 0.0],
        "loss_masks": [[1], [0]],
        "sample_indices": [3, 0],
        "rollout_log_probs": [[-0.25], [-1.5]],
    }
    return {**data, **change}


def test_rows_follow_the_dict_and_find_their_samples() -> None:
    data = train_data_from_slime(slime_dict(), groups())
    assert data.tokens == [[1, 2, 6], [1, 2, 3]] and data.loss_masks == [[1], [0]]
    # slime's `rewards` are final: they train as they are; `raw_reward` is slime's for logging only.
    assert data.raw_rewards == [0.5, -0.5] and data.reward_normalized == [True, True]
    assert data.group_ids == [1, 0] and data.sample_indices == [3, 0] and data.weight_versions == [7, None]
    assert data.rollout_log_probs == [[-0.25], [-1.5]]


def test_without_rollout_log_probs_rows_have_none() -> None:
    data = dict(slime_dict())
    del data["rollout_log_probs"]
    assert train_data_from_slime(data, groups()).rollout_log_probs == [None, None]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rewards": [1.0]}, "'rewards' has 1 entries, 'tokens' has 2"),
        ({"sample_indices": [3, 9]}, r"sample_indices\[1\] = 9 is not a sample of this rollout"),
        ({"loss_masks": [[1, 1], [0]]}, r"loss_masks\[0\] has 2 entries for response length 1"),
        ({"multimodal_inputs": [None, None]}, r"cannot train with \['multimodal_inputs'\]"),
    ],
)
def test_bad_dicts_name_the_flag_and_the_key(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=f"--custom-convert-samples-to-train-data-path: .*{message}"):
        train_data_from_slime(slime_dict(**change), groups())


def test_the_hook_gets_flat_samples_and_must_return_a_dict() -> None:
    seen: list[list[int]] = []

    def convert(args: object, samples: list[Sample]) -> dict[str, object]:
        seen.append([s.index for s in samples])
        return slime_dict()

    assert len(convert_hook(convert)(object(), groups())) == 2 and seen == [[0, 1, 2, 3]]
    with pytest.raises(TypeError, match="must return a dict"):
        convert_hook(lambda args, samples: [])(object(), groups())


def test_image_tensors_train_as_given() -> None:
    """slime's converter passes each sample's multimodal_train_inputs (pixel_values, image_grid_thw) per row."""
    images = [{"pixel_values": [[0.5]], "image_grid_thw": [[1, 2, 2]]}, None]
    assert train_data_from_slime(slime_dict(multimodal_train_inputs=images), groups()).multimodal_train_inputs == images
