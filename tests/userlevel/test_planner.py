"""The planner (``fedpriv.planning``, ``python -m fedpriv.privacy plan``): its local
σ is the one a run then uses and its ε per round the ledgers' after that run; its user-level
z and trajectory are dp-accounting's; it reads nothing and answers fast."""

import json
import time

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from clients.task import local_data
from fedpriv.federation.settings import RunSettings
from fedpriv.planning import Federation, plan
from fedpriv.privacy import PrivacyLedger
from fedpriv.privacy.__main__ import main
from fedpriv.privacy.accountants.rdp import ORDERS
from server.assign import Assigner
from server.discovery import ClientInfo
from server.run import run_server
from tests.conftest import SHARED_DATA
from tests.flower.inprocess import InProcessGrid, node_config

DELTA = 1e-5
LIMIT, NODES, ROUNDS, TARGET, LOT = 50, 2, 3, 4.0, 10
SIZES = tuple(len(local_data(RunSettings.from_run_config({"limit-train": LIMIT}),
                             {"partition-id": p, "num-partitions": NODES}, SHARED_DATA, partition_key=0).labels)
              for p in range(NODES))


@pytest.mark.usefixtures("task_identity")
def test_the_local_plan_is_what_a_run_uses_and_its_epsilon_what_the_ledgers_show(tmp_path, shared_data_dir):
    config = {"rounds": ROUNDS, "min-clients": NODES, "limit-train": LIMIT, "limit-test": 40, "model": "cnn",
              "data-dir": str(shared_data_dir), "state-dir": str(tmp_path / "server"), "target-epsilon": TARGET,
              "lot-size": LOT}
    nodes = {10 + i: node_config(i, NODES, tmp_path, **{"epsilon-budget": 100.0, "public-num-examples": True,
                                                         "data-dir": str(shared_data_dir)}) for i in range(NODES)}
    history = run_server(InProcessGrid(config, nodes), config)
    local = plan(Federation(population=NODES, rounds=ROUNDS, delta=DELTA, sizes=SIZES, lot_size=LOT,
                            target_epsilon=TARGET), ["local"])["modes"]["local"]
    smallest = str(SIZES.index(min(SIZES)))
    assert history.resolved["clients"][smallest]["noise_multiplier"] == local["noise_multiplier"]
    assert [r.epsilon[smallest] for r in history.rounds] == pytest.approx(local["epsilon"], rel=1e-12)
    node = PrivacyLedger.load(tmp_path / f"node{smallest}" / "ledger.json")
    assert node.spent(smallest) == pytest.approx(local["epsilon"][-1], rel=1e-12)


def test_the_local_plan_shares_the_lot_as_the_server_does():
    sizes = (3000, 4000, 50_000, 2500)  # the lot (4096) shared: q = 4096 / (2500 + 3000 + 4000 + 4·3000)
    settings = RunSettings.from_run_config({"target-epsilon": 2.0, "rounds": 5})
    assigner = Assigner(settings, {i: ClientInfo(str(i), n) for i, n in enumerate(sizes)})
    local = plan(Federation(population=4, rounds=5, delta=DELTA, sizes=sizes, target_epsilon=2.0),
                 ["local"])["modes"]["local"]
    assigned = assigner({3: ClientInfo("3", 2500)})[3].plan
    assert local["sample_rate"] == pytest.approx(4096 / 21_500)
    assert (assigned.noise_multiplier, assigned.sample_rate(2500)) == (local["noise_multiplier"], local["sample_rate"])


def test_the_user_level_plan_is_dp_accountings():
    fed = Federation(population=1000, cohort=100, rounds=20, delta=DELTA, target_epsilon=5.0, noise_multiplier=1.1)
    user = plan(fed, ["user"])["modes"]["user"]
    assert (user["noise_multiplier"], user["sample_rate"]) == (1.1, 0.1)
    for r in (1, 7, 20):
        acc = RdpAccountant(orders=list(ORDERS))
        acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.1)), r)
        assert user["epsilon"][r - 1] == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
    fits = user["rounds_affordable"]
    for rounds, ok in ((fits, True), (fits + 1, False)):
        acc = RdpAccountant(orders=list(ORDERS))
        acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.1)), rounds)
        assert bool(acc.get_epsilon(DELTA) <= 5.0) == ok
    assert user["noise_to_signal"] == pytest.approx(1.1 / 100)


def test_a_plan_at_a_given_noise_takes_under_a_second():
    fed = Federation(population=1000, cohort=100, rounds=100, delta=DELTA, sizes=(60,) * 1000, target_epsilon=5.0,
                     noise_multiplier=1.0)
    plan(fed)  # the accountant's curves for these (σ, q): computed once per process
    start = time.process_time()
    plan(Federation(population=1000, cohort=100, rounds=100, delta=DELTA, sizes=(60,) * 1000, target_epsilon=4.0,
                    noise_multiplier=1.0))
    assert time.process_time() - start < 1.0


def test_the_command_prints_each_mode_side_by_side_and_writes_json(tmp_path, capsys):
    sizes = tmp_path / "sizes.json"
    sizes.write_text(json.dumps([60] * 10))
    out = tmp_path / "plan.json"
    assert main(["plan", "--population", "10", "--cohort", "5", "--rounds", "4", "--data-sizes", str(sizes),
                 "--target-epsilon", "3", "--delta", "1e-5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    header = printed.splitlines()[0].split()
    assert header == ["local", "distributed", "user", "user-distributed"] and "needs issue" not in printed
    written = json.loads(out.read_text())
    assert set(written["modes"]) == {"local", "distributed", "user", "user-distributed"}
    assert len(written["modes"]["user"]["epsilon"]) == 4
    assert written["modes"]["user"]["epsilon"][-1] <= 3.0


def test_the_simulations_dry_run_prints_the_plan_of_its_flags_and_trains_nothing(tmp_path, capsys, shared_data_dir):
    from simulations.mnist import main as mnist

    out = tmp_path / "out"
    result = mnist(["--clients", str(NODES), "--rounds", str(ROUNDS), "--target-epsilon", str(TARGET),
                    "--limit-train", str(LIMIT), "--lot-size", str(LOT), "--data-dir", str(shared_data_dir),
                    "--privacy", "user", "--cohort", "1", "--out", str(out), "--seed", "0", "--dry-run"])
    sizes = tuple(len(local_data(RunSettings.from_run_config({"limit-train": LIMIT}),
                                 {"partition-id": p, "num-partitions": NODES}, shared_data_dir,
                                 partition_key=0).labels) for p in range(NODES))
    expected = plan(Federation(population=NODES, cohort=1, rounds=ROUNDS, delta=DELTA, sizes=sizes, lot_size=LOT,
                               target_epsilon=TARGET))
    assert result == expected
    assert capsys.readouterr().out.splitlines()[0].split() == ["local", "distributed", "user", "user-distributed"]
    assert not out.exists()
