"""Distributed-DP rounds end to end, in process: ``server.run.run_server`` with
``privacy = "distributed"`` against the real ClientApp (secure aggregation's four stages),
each node under its own policy and durable ledger."""

import math

import pytest
import torch
from torch.func import functional_call, grad, vmap

from fedpriv.data import load_dataset
from fedpriv.models import build_model, model_inputs
from fedpriv.privacy import distributed_dpsgd_event, epsilon_of
from fedpriv.privacy.events import DistributedDiscreteGaussianEvent, PoissonSampledEvent, SelfComposedEvent
from fedpriv.secagg.stages import RECORD_KEY, Stage
from server.run import run_server
from server.state import ServerState
from tests.flower.inprocess import InProcessGrid, booked, consortium, node_config

pytestmark = pytest.mark.usefixtures("task_identity")

SEED = 5


def _config(data_dir, **overrides):
    return {"rounds": 2, "min-clients": 3, "limit-train": 60, "limit-test": 40, "lot-size": 30,
            "noise-multiplier": 1.0, "model": "cnn", "seed": SEED, "data-dir": str(data_dir),
            "privacy": "distributed", **overrides}


def _nodes(tmp_path, data_dir, policies):
    """In-process nodes with ``policies``, all of one consortium (a CA, an identity each)."""
    members = consortium(tmp_path / "consortium", len(policies))
    return {10 + i: node_config(i, len(policies), tmp_path, **{
        "epsilon-budget": 1e6, "public-num-examples": True, "data-dir": str(data_dir), "randomness": "seeded",
        "seed": 11 + i, "allow-distributed": True, **members[i], **policy}) for i, policy in enumerate(policies)}


def _ddg(events) -> DistributedDiscreteGaussianEvent:
    (event,) = events
    assert isinstance(event, SelfComposedEvent) and isinstance(event.event, PoissonSampledEvent)
    return event.event.event


def test_each_node_books_its_own_worst_case_and_the_server_the_nominal_cohort(tmp_path, shared_data_dir):
    run_config = _config(shared_data_dir)
    policies = [{"min-cohort": 3}, {"min-cohort": 3}, {"min-cohort": 3, "max-dropouts": 1}]
    history = run_server(InProcessGrid(run_config, _nodes(tmp_path, shared_data_dir, policies)), run_config)
    resolved = history.resolved
    assert [r.survivors for r in history.rounds] == [["0", "1", "2"]] * 2
    assert history.model_sha256 != _initial_sha()
    scale, sigma, clip = resolved["lattice_scale"], resolved["noise_multiplier"], 0.1
    for i, honest in enumerate([3, 3, 2]):
        entries = booked(tmp_path / f"node{i}")[str(i)]
        train = [events for entry, events in entries.items() if entry.endswith("/train")]
        assert len(train) == 2
        ddg = _ddg(train[0])
        assert ddg.shares == honest
        # each share alone: σ·C·scale/√n, so that the n honest shares carry σ·C·scale
        assert ddg.noise_stddev == pytest.approx(sigma * clip * scale / math.sqrt(honest), rel=1e-12)
    q = resolved["shared_sample_rate"]
    nominal = distributed_dpsgd_event(sigma * clip * scale / math.sqrt(3), 3, resolved["sensitivity"],
                                      resolved["dimension"], q, 2)
    two_shares = distributed_dpsgd_event(sigma * clip * scale / math.sqrt(2), 2, resolved["sensitivity"],
                                         resolved["dimension"], q, 2)
    # the server's ledger: the nominal cohort. Node 2 guarantees only 2 honest shares, so its
    # own share is √(3/2) larger: its 2 shares alone carry σ, and it books that same ε
    assert history.final_epsilon()["0"] == pytest.approx(epsilon_of(nominal, 1e-5))
    assert epsilon_of(two_shares, 1e-5) == pytest.approx(epsilon_of(nominal, 1e-5))
    # one share fewer than it assumes would not: a node that trusted the server's K = 3
    # while only 2 honest shares remain would have spent more than it booked
    short = distributed_dpsgd_event(sigma * clip * scale / math.sqrt(3), 2, resolved["sensitivity"],
                                    resolved["dimension"], q, 2)
    assert epsilon_of(short, 1e-5) > epsilon_of(nominal, 1e-5)


def _initial_sha():
    from fedpriv.models import model_sha256

    return model_sha256(build_model("cnn", SEED))


def test_a_node_whose_policy_does_not_allow_it_refuses_and_books_nothing(tmp_path, shared_data_dir):
    run_config = _config(shared_data_dir, rounds=1, **{"min-clients": 4})
    policies = [{"min-cohort": 2}] * 3 + [{"min-cohort": 2, "allow-distributed": False}]
    history = run_server(InProcessGrid(run_config, _nodes(tmp_path, shared_data_dir, policies)), run_config)
    (round_log,) = history.rounds  # 3 of 4 survive: SecAgg's threshold ⌊2·4/3⌋ + 1 = 3
    assert round_log.survivors == ["0", "1", "2"] and "allow-distributed" in round_log.failed["3"]
    assert not [k for k in booked(tmp_path / "node3").get("3", {}) if k.endswith("/train")]


def test_a_cohort_below_a_nodes_minimum_is_refused_before_that_node_books(tmp_path, shared_data_dir):
    run_config = _config(shared_data_dir, rounds=1, **{"min-clients": 4})
    policies = [{"min-cohort": 2}] * 3 + [{"min-cohort": 5}]
    history = run_server(InProcessGrid(run_config, _nodes(tmp_path, shared_data_dir, policies)), run_config)
    (round_log,) = history.rounds
    assert round_log.survivors == ["0", "1", "2"] and "below this node's minimum" in round_log.failed["3"]
    assert not [k for k in booked(tmp_path / "node3").get("3", {}) if k.endswith("/train")]
    assert [k for k in booked(tmp_path / "node0")["0"] if k.endswith("/train")]


def test_one_node_with_the_whole_lot_steps_exactly_as_centralized_dp_sgd_without_noise(tmp_path, shared_data_dir):
    """q = 1 (lot ≥ N) and σ ≈ 0: the server's step is lr·Σ clip(∇ℓᵢ)/N, computed here
    independently with torch.func, to within the lattice's rounding."""
    run_config = _config(shared_data_dir, rounds=1, **{"min-clients": 1, "limit-train": 20, "lot-size": 20,
                                                      "noise-multiplier": 1e-9, "state-dir": str(tmp_path / "server")})
    nodes = _nodes(tmp_path, shared_data_dir, [{"min-cohort": 1, "epsilon-budget": math.inf}])
    history = run_server(InProcessGrid(run_config, nodes), run_config)
    assert history.rounds[0].survivors == ["0"]
    scale = history.resolved["lattice_scale"]
    train = load_dataset("mnist", shared_data_dir, train=True, limit=20)
    model = build_model("cnn", SEED)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = model_inputs("cnn", train.features)

    def loss(p, xi, yi):
        return torch.nn.functional.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, train.labels)
    flat = torch.cat([g.reshape(len(x), -1) for g in per_example.values()], dim=1).double()
    clipped = flat * torch.clamp(0.1 / flat.norm(dim=1, keepdim=True), max=1.0)
    expected = torch.cat([p.reshape(-1) for p in params.values()]).double() - 4.0 * clipped.sum(0) / 20
    trained = build_model("cnn", SEED)
    _, arrays = ServerState(str(tmp_path / "server")).load()
    trained.load_state_dict(arrays.to_torch_state_dict())
    got = torch.cat([p.detach().reshape(-1) for p in trained.parameters()]).double()
    # per coordinate: each of the 20 rounded examples is off by < 1 lattice unit
    assert (got - expected).abs().max().item() <= 4.0 * 20 / scale / 20 + 1e-6


def test_a_node_lost_after_masking_leaves_a_round_whose_survivors_still_carry_the_booked_noise(tmp_path,
                                                                                               shared_data_dir):
    """5 nodes tolerating one dropout (n = 4 honest shares each); node 4's masked vector is
    lost: the round is unmasked over the 4 survivors, whose shares alone carry σ·C·scale, and
    every node, the lost one too, has booked the round."""
    run_config = _config(shared_data_dir, rounds=1, **{"min-clients": 5, "limit-train": 100})
    grid = InProcessGrid(run_config, _nodes(tmp_path, shared_data_dir, [{"min-cohort": 5, "max-dropouts": 1}] * 5))
    grid.lose = lambda node, message: node == 14 and _stage(message) == Stage.COLLECT
    history = run_server(grid, run_config)
    (round_log,) = history.rounds
    assert round_log.survivors == ["0", "1", "2", "3"] and round_log.discarded is None
    assert history.model_sha256 != _initial_sha()
    for i in range(5):
        (train,) = [e for k, e in booked(tmp_path / f"node{i}")[str(i)].items() if k.endswith("/train")]
        assert _ddg(train).shares == 4


def test_a_round_with_more_dropouts_than_the_nodes_tolerate_is_discarded_not_stepped(tmp_path, shared_data_dir):
    run_config = _config(shared_data_dir, rounds=1, **{"min-clients": 5, "limit-train": 100})
    grid = InProcessGrid(run_config, _nodes(tmp_path, shared_data_dir, [{"min-cohort": 5, "max-dropouts": 1}] * 5))
    grid.lose = lambda node, message: node in (13, 14) and _stage(message) == Stage.COLLECT
    history = run_server(grid, run_config)
    (round_log,) = history.rounds
    assert round_log.discarded and "no sum" in round_log.discarded
    assert history.model_sha256 == _initial_sha()  # nothing stepped with less noise than booked


def _stage(message):
    record = message.content.config_records.get(RECORD_KEY)
    return None if record is None else record.get("stage")


def test_a_target_epsilon_leaves_room_for_the_nodes_released_counts(tmp_path, shared_data_dir):
    """Nodes that release a DP count of N: σ is calibrated beside that release, so every
    round of the run fits the target and the last one ends just under it."""
    run_config = _config(shared_data_dir, rounds=3, **{"noise-multiplier": -1.0, "target-epsilon": 4.0})
    nodes = _nodes(tmp_path, shared_data_dir, [{"min-cohort": 3, "public-num-examples": False}] * 3)
    history = run_server(InProcessGrid(run_config, nodes), run_config)
    assert len(history.rounds) == 3 and history.stopped is None
    for i in range(3):
        entries = booked(tmp_path / f"node{i}")[str(i)]
        assert any(k.startswith("release/num-examples/") for k in entries)
        assert 3.5 < history.final_epsilon()[str(i)] <= 4.0
