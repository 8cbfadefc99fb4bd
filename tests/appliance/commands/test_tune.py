"""``appliance tune``'s progress bar: it counts right and stays inside its frame."""

from __future__ import annotations

import pytest

from appliance.commands.tune import progress_line


@pytest.mark.parametrize("width", [20, 40, 80, 200])
def test_a_frame_never_outgrows_the_terminal(width):
    line = progress_line("building onnxruntime:CPU@intra4,inter1,graph_all with a very long plan name", 2, 5, width)
    assert len(line) <= max(width - 1, len("[....................] 2/5 "))


def test_the_count_never_passes_the_steps():
    assert progress_line("chose onnxruntime:CPU", 7, 4, 80).startswith("[####################] 4/4 chose")
    assert progress_line("building", 1, 4, 80).startswith("[#####...............] 1/4 building")
