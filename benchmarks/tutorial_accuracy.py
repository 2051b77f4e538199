"""One full epoch (5,000 images, batch 8) of the seed tutorials' MNIST programs (tutorial 1 SGD,
the notebook, tutorial 2 Adam), tested on all 10,000 test images. Reuses the tutorial-style
programs of tests/addons/test_seed_programs.py.

    python benchmarks/tutorial_accuracy.py
"""
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import popart, popdist, popxl  # noqa: E402,F401  (first: the folders tests/popart and
# tests/popdist would be found as namespace packages once tests/ is on sys.path)
sys.path[:0] = [str(ROOT / "tests" / "addons"), str(ROOT / "tests")]

import test_seed_programs as programs  # noqa: E402

programs.TEST_BATCHES = 125  # 125 x 80 = the whole test set
for name, lr, adam, notebook in [("tutorial 1 (SGD, lr 0.05)", 0.05, False, False),
                                 ("notebook (SGD, lr 0.05)", 0.05, False, True),
                                 ("tutorial 2 (Adam, lr 1e-3)", 1e-3, True, False)]:
    t0 = time.perf_counter()
    _, acc = programs._train_and_test(lr, 625, use_adam=adam, notebook=notebook)
    print(f"{name}: 1 epoch, accuracy on 10,000 test images {acc:.2f}% "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
