"""The package layering: `common` and the model/training/fine-tuning code never import Beam or
a Beam job, so a training or fine-tuning machine needs neither (docs/design.md, the package
table)."""
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import common

REPO = Path(__file__).resolve().parents[2]
COMMON_MODULES = sorted(f"common.{m.name}" for m in pkgutil.iter_modules(common.__path__))


def imported_after(module: str) -> set[str]:
    """The top-level packages in sys.modules after `import module` in a fresh interpreter."""
    code = (f"import sys, {module}\n"
            "print(' '.join(sorted({name.split('.')[0] for name in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_common_holds_the_shared_library():
    assert COMMON_MODULES == ["common.bin_packing", "common.errors", "common.extras",
                              "common.logs", "common.masking",
                              "common.optimizer", "common.settings", "common.shard_format",
                              "common.storage", "common.tokenization"]


@pytest.mark.parametrize("module", COMMON_MODULES)
def test_common_imports_neither_beam_nor_a_job(module):
    loaded = imported_after(module)
    assert "common" in loaded
    assert not loaded & {"apache_beam", "pipelines", "torch"}, sorted(loaded)


@pytest.mark.parametrize("module", ["model", "training.config", "training.loader",
                                    "finetune.loop", "finetune.packing", "finetune.glue.family",
                                    "finetune.squad.family", "finetune.multiple_choice.family",
                                    "finetune.ner.family"])
def test_model_training_and_finetuning_import_no_beam(module):
    loaded = imported_after(module)
    assert module.split(".")[0] in loaded
    assert not loaded & {"apache_beam", "pipelines"}, sorted(loaded & {"apache_beam", "pipelines"})
