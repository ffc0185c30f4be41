import pytest

from dif.media.frame_counts import nearest_frame_counts


@pytest.mark.parametrize(("frames", "near"), [(5, None), (22, None), (124, None), (23, "22 or 39"), (38, "22 or 39"),
                                              (1, "5"), (0, "5"), (6, "5 or 22")])  # fmt: skip
def test_counts_of_the_form_17n_plus_5(frames: int, near: str | None) -> None:
    assert nearest_frame_counts(frames, 17, 5) == near
