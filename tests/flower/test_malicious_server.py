"""A malicious server against the real ClientApp's distributed rounds, in process
(docs/threat-model.md, "Distributed DP against a malicious server"): each test is an attack
that worked on fedpriv before issue 33 and must now fail.

- Settings told apart per node (lattice scale, σ, C) give no decodable sum, even to a server
  that ignores its own checks and relays every signature: the masks are keyed by each
  node's settings digest and a node unmasks only with t signatures on its own digest.
- Sybil keys: a node with a consortium CA refuses a cohort holding keys no identity of its CA
  signed (none, another CA's, a replayed certificate, one identity twice); a node without a
  CA refuses by default, or books its own share alone and sends a share that carries σ alone.
- A secure sum of another dimension or modulus, a lattice whose Δ₂ the rounding cannot
  enforce, a model for another data set: refused before anything is booked.
"""

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MessageType, RecordDict

import fedpriv.distributed.contribution as contribution_module
import server.secure_sum as server_secure_sum
from clients.client_app import app as real_app
from clients.distributed import record_encoding
from clients.secure_sum import answer_stage, is_secure_sum
from fedpriv.certificates import write_consortium
from fedpriv.federation import protocol
from fedpriv.models import build_model
from fedpriv.privacy import PrivacyLedger
from fedpriv.secagg import Requirements, SecureAggregation, Vector
from fedpriv.secagg.identity import Identity, load_identity
from fedpriv.training import TrainingPlan
from server.secure_sum import secure_sum
from tests.flower.inprocess import InProcessGrid, booked, node_config
from tests.flower.metadata import set_metadata
from tests.flower.test_distributed_round import SEED, _config, _nodes

pytestmark = pytest.mark.usefixtures("task_identity")

PLAN = TrainingPlan(model="cnn", lot_size=30, max_grad_norm=0.1, noise_multiplier=1.0, lr=0.1)
ARRAYS = ArrayRecord(build_model("cnn", SEED).state_dict())
D = sum(p.numel() for p in build_model("cnn", SEED).parameters())
ROUND_KEY = "run-x/round-1/train"


def _round(plan: TrainingPlan = PLAN, scale: float = 2.0**10, bits: int = 32) -> ConfigRecord:
    """The collect stage's config of a record-level round (q = 0.5, nearest rounding)."""
    return ConfigRecord({**protocol.plan_config(plan), protocol.SAMPLE_RATE: 0.5, protocol.LATTICE_SCALE: scale,
                         protocol.MODULUS_BITS: bits, protocol.LATTICE_ROUNDING: "nearest",
                         protocol.SERVER_ROUND: 1, protocol.RUN_KEY: "run-x"})


def _sum(grid: InProcessGrid, configs: dict[int, ConfigRecord], *, dimension: int = D, bits: int = 32):
    def content(node: int) -> RecordDict:
        return RecordDict({protocol.ARRAYS: ARRAYS, protocol.CONFIG: configs[node]})

    return secure_sum(grid, sorted(configs), dimension=dimension, modulus_bits=bits, threshold=len(configs) // 2 + 1,
                      collect_content=content, timeout=None, round_key=ROUND_KEY)


def _trained(state, partition: int) -> list[str]:
    """The node's booked training entries (none: nothing was booked)."""
    return [e for e in booked(state / f"node{partition}").get(str(partition), {}) if e.endswith("/train")]


class Lying(SecureAggregation):
    """A server that ignores its own checks: it records every survivor's settings digest as
    the first one's and relays every signature, so each round reaches the unmask stage."""

    def _accept_collect(self, node, reply):
        super()._accept_collect(node, reply)
        self.settings[node] = next(iter(self.settings.values()))

    def _accept_consistency(self, node, reply):
        self.signatures[node] = reply["signature"]


@pytest.mark.parametrize("told_apart", [
    None,  # the control: the same settings to both, and the lying server gets its sum
    {protocol.LATTICE_SCALE: 16.0},
    {"noise-multiplier": 0.01},
    {"max-grad-norm": 10.0},
])
def test_nodes_told_different_settings_give_no_decodable_sum(tmp_path, shared_data_dir, monkeypatch, told_apart):
    """Node 11 gets the run's settings, node 10 a variant (before issue 33, the sum of node
    11's gradients with node 10's share alone, in node 11's units: its noise was cut by √2
    or more while it booked two shares)."""
    monkeypatch.setattr(server_secure_sum, "SecureAggregation", Lying)
    grid = InProcessGrid(_config(shared_data_dir), _nodes(tmp_path, shared_data_dir, [{"min-cohort": 2}] * 2))
    variant = _round(scale=(told_apart or {}).get(protocol.LATTICE_SCALE, 2.0**10))
    for key, value in (told_apart or {}).items():
        variant[key] = value
    result = _sum(grid, {10: variant, 11: _round()})
    if told_apart is None:
        assert result.sum is not None and result.reason is None
        return
    assert result.sum is None
    assert all("does not verify" in result.dropped[n] for n in (10, 11)), result.dropped  # neither unmasked


def test_a_lattice_modulus_other_than_the_secure_sums_is_refused_before_booking(tmp_path, shared_data_dir):
    """Before issue 33: lattice 2^32 to one node, 2^62 to another, a 2^64 sum: the server read
    every node's own sign on every coordinate."""
    grid = InProcessGrid(_config(shared_data_dir), _nodes(tmp_path, shared_data_dir, [{"min-cohort": 2}] * 2))
    result = _sum(grid, {10: _round(bits=62), 11: _round(bits=32)}, bits=32)
    assert result.sum is None and "must be one" in result.dropped[10]
    assert _trained(tmp_path, 0) == []


@pytest.mark.parametrize("forged, why", [
    ({"dimension": D + 1}, "the secure sum has dimension"),
    ({"plan": TrainingPlan(model="cnn", lot_size=30, max_grad_norm=10.0, noise_multiplier=1.0, lr=0.1),
      "scale": 2.0**24}, "exceeds the largest norm"),
    ({"plan": TrainingPlan(model="cifar_cnn", lot_size=30, max_grad_norm=0.1, noise_multiplier=1.0, lr=0.1),
      "arrays": ArrayRecord(build_model("cifar_cnn", SEED).state_dict())}, "does not take mnist inputs"),
])
def test_a_round_the_secure_sum_cannot_carry_is_refused_before_booking(tmp_path, shared_data_dir, forged, why):
    """Each failed only after booking before issue 33: a vector of another length, a lattice
    whose Δ₂ (here 1.7·10⁸) is beyond what the rounding bounds (2^26: it failed only when
    the private lot was non-empty), a model built for CIFAR-10 in an MNIST run."""
    grid = InProcessGrid(_config(shared_data_dir), _nodes(tmp_path, shared_data_dir, [{"min-cohort": 2}] * 2))
    config = _round(plan=forged.get("plan", PLAN), scale=forged.get("scale", 2.0**10))
    arrays = forged.get("arrays", ARRAYS)
    result = secure_sum(grid, [10, 11], dimension=forged.get("dimension", D), modulus_bits=32, threshold=2,
                        collect_content=lambda node: RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: config}),
                        timeout=None, round_key=ROUND_KEY)
    assert result.sum is None and all(why in result.dropped[n] for n in (10, 11)), result.dropped
    assert _trained(tmp_path, 0) == [] and _trained(tmp_path, 1) == []


@pytest.mark.parametrize("message_type", [MessageType.TRAIN, MessageType.EVALUATE])
def test_a_model_for_another_data_set_is_refused_before_booking(tmp_path, shared_data_dir, message_type):
    run_config = {"limit-train": 60, "limit-test": 40}
    node = node_config(0, 2, tmp_path, **{"epsilon-budget": math.inf, "public-num-examples": True,
                                          "data-dir": str(shared_data_dir), "allow-evaluate": True})
    grid = InProcessGrid(run_config, {10: node})
    plan = TrainingPlan(model="cifar_cnn", lot_size=30, max_grad_norm=0.1, noise_multiplier=1.0, lr=0.1)
    config = ConfigRecord({**protocol.plan_config(plan), protocol.MODEL: "cifar_cnn", protocol.SERVER_ROUND: 1,
                           protocol.RUN_KEY: "run-x"})
    message = Message(RecordDict({protocol.ARRAYS: ArrayRecord(build_model("cifar_cnn", 0).state_dict()),
                                  protocol.CONFIG: config}), dst_node_id=10, message_type=message_type)
    set_metadata(message, message_id="m")
    reply = real_app(message, grid.contexts[10])
    assert reply.has_error() and reply.error.code == protocol.REFUSAL_CODE
    assert "does not take mnist inputs" in reply.error.reason
    assert PrivacyLedger.load(tmp_path / "node0" / "ledger.json").entries("0") == {}


def _noiseless(msg: Message, context, stage) -> tuple[Vector, RecordDict]:
    """A server's node's vector: zeros, under the settings the honest nodes compute it under."""
    config = msg.content.config_records[protocol.CONFIG]
    _, _, settings = record_encoding(config, protocol.read_plan(config), stage.dimension, stage)
    return Vector(np.zeros(stage.dimension, dtype=np.uint64), settings), RecordDict()


def _sybil_app(honest: set[int], identities: dict[int, Identity | None]):
    """The real ClientApp for the ``honest`` nodes; the server's own nodes answer every stage
    with fresh keys, signed by ``identities[node]`` (None: unsigned), and zeros."""
    def app(msg: Message, context) -> Message:
        if context.node_id in honest or not is_secure_sum(msg):
            return real_app(msg, context)
        requirements = Requirements(min_cohort=1, min_survivors=1, max_colluders=0,
                                    identity=identities.get(context.node_id))
        try:
            return Message(answer_stage(msg, context, requirements, _noiseless), reply_to=msg)
        except ValueError as err:  # its own identity checks (what the honest nodes do is all that matters)
            return Message(Error(code=protocol.REFUSAL_CODE, reason=str(err)), reply_to=msg)
    return app


def _sybil_identities(tmp_path, case: str) -> dict[int, Identity | None]:
    """Nodes 12 and 13 of the server, by ``case``."""
    if case == "unsigned":
        return {12: None, 13: None}
    if case == "the server's own CA":
        ca = write_consortium(tmp_path / "server-ca", ["sybil"])
        return dict.fromkeys((12, 13), load_identity(ca, tmp_path / "server-ca" / "sybil"))
    consortium = tmp_path / "consortium"
    honest = load_identity(consortium / "ca.pem", consortium / "node0")
    if case == "an honest node's certificate replayed":
        forged = load_identity(write_consortium(tmp_path / "server-ca", ["sybil"]), tmp_path / "server-ca" / "sybil")
        return dict.fromkeys((12, 13), Identity(honest.ca, honest.certificate, forged.key))
    assert case == "one colluding member's identity twice"
    write_consortium(consortium, ["colluder"])  # a member the consortium certified, colluding with the server
    return dict.fromkeys((12, 13), load_identity(consortium / "ca.pem", consortium / "colluder"))


@pytest.mark.parametrize("case, why", [
    ("unsigned", "no identity certificate"),
    ("the server's own CA", "not a certificate of the consortium CA"),
    ("an honest node's certificate replayed", "not signed by its identity"),
    ("one colluding member's identity twice", "the identity of another cohort member"),
])
def test_a_node_with_a_consortium_ca_refuses_sybil_keys_before_booking(tmp_path, shared_data_dir, case, why):
    """Nodes 10 and 11 (policy: min-cohort 4, max-colluders 1) are shown a cohort of 4 whose
    nodes 12 and 13 are the server's. Before issue 33 they took part and booked 3 honest
    shares where they had 2, or 1 with both secrets of a node rebuilt by the Sybils."""
    nodes = _nodes(tmp_path, shared_data_dir, [{"min-cohort": 4, "max-colluders": 1}] * 4)
    sybils = _sybil_identities(tmp_path, case)
    grid = InProcessGrid(_config(shared_data_dir), nodes, client_app=_sybil_app({10, 11}, sybils))
    result = _sum(grid, dict.fromkeys(nodes, _round()))
    assert result.sum is None
    for honest in (10, 11):
        assert "not certified by this node's consortium CA" in result.dropped[honest] or \
            "identity of another cohort member" in result.dropped[honest], result.dropped
        assert why in result.dropped[honest]
    assert _trained(tmp_path, 0) == [] and _trained(tmp_path, 1) == []


def _without_ca(tmp_path, data_dir, **policy):
    return {10 + i: node_config(i, 3, tmp_path, **{
        "epsilon-budget": 1e6, "public-num-examples": True, "data-dir": str(data_dir), "randomness": "seeded",
        "seed": 11 + i, "allow-distributed": True, "min-cohort": 3, **policy}) for i in range(3)}


def test_a_node_without_a_ca_refuses_by_default_and_books_nothing(tmp_path, shared_data_dir):
    grid = InProcessGrid(_config(shared_data_dir), _without_ca(tmp_path, shared_data_dir),
                         client_app=_sybil_app({10}, {}))
    result = _sum(grid, dict.fromkeys((10, 11, 12), _round()))
    assert "no consortium CA" in result.dropped[10] and "uncertified-cohort = refuse" in result.dropped[10]
    assert _trained(tmp_path, 0) == []


def test_a_node_without_a_ca_that_books_its_own_share_sends_a_share_that_carries_sigma_alone(
        tmp_path, shared_data_dir, monkeypatch):
    """``uncertified-cohort = own-share``: the server pads a cohort of 3 (the node's min-cohort)
    with 2 noiseless nodes of its own and unmasks. The node's share alone has std σ·C·scale
    (measured on the vector it sent), and its ledger books one share of that std."""
    noise = []
    noised_vector = contribution_module.noised_vector

    def spy(total, lattice, stddev, generator):
        vector = noised_vector(total, lattice, stddev, generator)
        centred = (vector.astype(np.int64) - total) % lattice.modulus
        noise.append(np.where(centred >= lattice.modulus // 2, centred - lattice.modulus, centred))
        return vector

    monkeypatch.setattr(contribution_module, "noised_vector", spy)
    grid = InProcessGrid(_config(shared_data_dir), _without_ca(tmp_path, shared_data_dir, **{
        "uncertified-cohort": "own-share"}), client_app=_sybil_app({10}, {}))
    result = _sum(grid, dict.fromkeys((10, 11, 12), _round()))
    assert result.sum is not None  # the Sybils' sum was unmasked: the node's share is all the noise there is
    full = PLAN.noise_multiplier * PLAN.max_grad_norm * 2.0**10
    (measured,) = noise
    assert float(measured.var()) == pytest.approx(full**2, rel=0.05)  # d ≈ 26,000 draws: ±1.7 % at 2σ
    (event,) = PrivacyLedger.load(tmp_path / "node0" / "ledger.json").events("0")
    ddg = event.event.event
    assert ddg.shares == 1 and ddg.noise_stddev == pytest.approx(full, rel=1e-12)
