"""The Fashion-MNIST example end to end: 4 PyTorch worker processes against
the C++ servers, for a short run under each policy."""

from __future__ import annotations

import os
import sys

import pytest

from conftest import ROOT, bin_dir, work_dir

sys.path.insert(0, os.path.join(ROOT, "python", "examples"))
import fashion_mnist  # noqa: E402


@pytest.mark.parametrize("mode", ["bsp", "ssp", "asp"])
def test_four_workers_learn(mode):
    args = fashion_mnist.parse_args([
        f"--mode={mode}", "--workers=4", "--servers=2", "--steps=250",
        "--eval_every=125", f"--bin_dir={bin_dir()}",
        f"--out_dir={work_dir('example-' + mode)}", "--timeout_s=600"])
    result = fashion_mnist.run_job(args)
    accuracies = [a for _, _, a in result["curve"]]
    assert [s for _, s, _ in result["curve"]] == [0, 125, 250]
    assert accuracies[0] < 0.3  # untrained: about one class in ten
    # About one epoch: the C++ demo's MLP is near 80% there.
    assert accuracies[-1] > 0.72, accuracies
    assert result["epochs"] == pytest.approx(250 * 4 * 64 / 60000)
