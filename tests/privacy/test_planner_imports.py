"""``python -m fedpriv.privacy plan`` imports only what a mode needs: torch (~1.5 s) only for
the model's dimension (the distributed modes' lattice), Flower never; the packages whose
training code needs torch still give every name of their API."""

import json
import subprocess
import sys

import pytest

from tests.timeouts import scaled

SHAPE = ["--population", "1000", "--cohort", "100", "--rounds", "50", "--records-per-client", "60",
         "--target-epsilon", "5", "--delta", "1e-5"]


def _imported(modes: list[str]) -> dict[str, bool]:
    """Which heavy packages a fresh interpreter holds after planning ``modes``."""
    flags = [a for m in modes for a in ("--privacy", m)]
    code = ("import json, sys; from fedpriv.privacy.__main__ import main; main(sys.argv[1:]); "
            "print(json.dumps({p: p in sys.modules for p in ('torch', 'flwr', 'matplotlib')}))")
    done = subprocess.run([sys.executable, "-c", code, "plan", *flags, *SHAPE], capture_output=True, text=True,
                          timeout=scaled(300), check=True)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("modes", [["user"], ["local"], ["local", "user"]])
def test_planning_the_record_level_local_or_user_level_mode_imports_neither_torch_nor_flower(modes):
    assert _imported(modes) == {"torch": False, "flwr": False, "matplotlib": False}


def test_planning_a_distributed_mode_imports_torch_for_the_models_dimension_but_not_flower():
    assert _imported(["distributed", "user-distributed"]) == {"torch": True, "flwr": False, "matplotlib": False}


def test_the_training_and_engine_names_still_load_on_use():
    import fedpriv.dpsgd
    import fedpriv.training
    from fedpriv.dpsgd import engine, modules
    from fedpriv.training import evaluation, local

    assert fedpriv.training.train_round is local.train_round and fedpriv.training.evaluate is evaluation.evaluate
    assert (fedpriv.dpsgd.train_dpsgd, fedpriv.dpsgd.UnsupportedModuleError) == (engine.train_dpsgd,
                                                                                 modules.UnsupportedModuleError)
    assert all(hasattr(fedpriv.training, n) for n in fedpriv.training.__all__)
    assert all(hasattr(fedpriv.dpsgd, n) for n in fedpriv.dpsgd.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fedpriv.training.nothing  # noqa: B018

