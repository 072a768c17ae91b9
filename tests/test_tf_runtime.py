"""TensorFlow's set-up in a process of the runtime (`madlib_mop.runtime.tf_runtime`), each in
a new interpreter: what the first import leaves behind depends on what came before it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Prints how many objects are frozen out of the garbage collector's reach.
SCRIPT = """
import gc, sys
if sys.argv[1] == "client":
    import tensorflow  # a program that imported TensorFlow itself, before madlib_mop
from madlib_mop.runtime.tf_runtime import import_tensorflow
import_tensorflow(1)
print(gc.get_freeze_count())
"""


def _frozen(kind: str) -> int:
    done = subprocess.run([sys.executable, "-c", SCRIPT, kind], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


def test_the_first_import_freezes_what_it_made():
    """A worker session's collections no longer walk TensorFlow's and Keras' own objects."""
    assert _frozen("worker") > 100_000  # (some 400,000 with TensorFlow 2.21)
    # A program's own objects are its own: nothing frozen where TensorFlow came before us.
    assert _frozen("client") == 0


def test_the_first_import_leaves_keras_optional_integrations_out():
    """Keras' optional integrations (scikit-learn, pandas, matplotlib, ...) are not imported
    with TensorFlow in a worker, and can still be imported after it."""
    script = ("import sys\n"
              "from madlib_mop.runtime.tf_runtime import OPTIONAL_EXTRAS, import_tensorflow\n"
              "import_tensorflow(1)\n"
              "print(sorted(n for n in OPTIONAL_EXTRAS if sys.modules.get(n) is not None))\n"
              "import scipy.sparse, sklearn\n"
              "print(sklearn.__name__)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[]", "sklearn"]
