"""A node's side of a secure sum: SecAgg+ on the full graph or, where its policy opts in, on
the server's sparse graph (``graph``): its *group* is the nodes it shares with and masks
against, itself included: the whole cohort, or itself and its neighbours.

The node answers the five stages (``stages.Stage``) of an untrusted server, each at most once
per setup and in order; its state lives in a Flower ``ConfigRecord`` between messages
(``NodeState.to_record``/``from_record``, kept in ``context.state``). Whatever the server
claims, the node itself checks what its privacy rests on (``Requirements``, from its policy)
and refuses (``SecAggRefusal``) before it sends anything that would weaken it:

- its group is the distinct keys it receives (its own among them, unchanged), all keys
  distinct; the cohort is the group, or on a sparse graph the ids sent beside it, of which
  the group is that node's neighbourhood in the round's Harary graph (``graph.harary``);
  the cohort has at least ``min_cohort`` nodes;
- with an ``identity`` (a consortium CA in its policy: ``identity``), every cohort member's
  keys of the round are signed by a distinct identity its CA certifies: the server cannot
  count nodes of its own (Sybils) toward the cohort;
- a group smaller than the cohort (a sparse graph) only if its policy sets
  ``min_neighbours``, and with at least that many neighbours;
- the threshold t exceeds ``max_colluders`` and is at most the group of n, and 2t > n + c:
  two disjoint groups of honest nodes can then never each hand t shares of one node (one of
  b, one of sk1) to a server that tells them different lists;
- at least min(``min_survivors``, n) - 1 others sent it shares before it masks its vector;
- it signs one list of survivors per round (cohort members, itself among them, at least
  ``min_survivors``, at least t of its group, all of those nodes it masked with), and
  unmasks only for that list, with t signatures of its group on it: on the full graph, with
  2t > n + c no two lists get t signatures, so every honest node that unmasks was told the
  same survivors, none of whose sk1 is ever revealed, and each of whom masked with all the
  others: the server learns their sum, no smaller one (on a sparse graph this holds within
  each group only: ``docs/threat-model.md``);
- one unmask request per setup, answered only with disjoint active and dead lists of ids it
  holds shares of (of the active list, those of its group).

A refused or out-of-order stage aborts the round: the node's secrets and the shares it holds
are erased, so no later request of that round gets anything.

One round, one set of settings: ``contribute`` returns the vector with the settings it was
computed under (plan, noise, lattice: ``Vector.settings``); with the secure sum's own (round
key, threshold, modulus, dimension, cohort and graph) they make the round's settings digest
(``keys.settings_digest``), which keys the pairwise masks (HKDF info) and is part of what the
node signs at the consistency stage. Two nodes given different settings derive masks that do
not cancel (no decodable sum), and a node unmasks only with t signatures on its own digest
(Bonawitz et al. 2017's consistency round).

The masked vector is (x + PRG(b) + Σ_v ±PRG(s_uv)) mod 2^bits with b = os.urandom(32) fresh
each round and s_uv from ECDH on the first key pair and the settings digest; shares of b and
of sk1 go to every group member, encrypted under ECDH on the second key pair (Fernet). PRG is
ChaCha20 (``prg``).

Why one module of about 460 lines: it is one state machine whose checks the list above
argues for together (each stage's check relies on what the earlier stages stored and
erased); the reusable parts are already apart (``graph``, ``keys``, ``prg``, ``identity``,
``stages``), and splitting the stages would spread one security argument over files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from cryptography.fernet import InvalidToken
from flwr.app import ConfigRecord
from flwr.common.secure_aggregation.crypto.shamir import create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
    sign_message,
)

from fedpriv.secagg import graph, keys, prg
from fedpriv.secagg import stages as s
from fedpriv.secagg.identity import Identity, peer_identity
from fedpriv.secagg.stages import Stage

ABORTED = "aborted"
PREVIOUS = {Stage.SHARE_KEYS: Stage.SETUP, Stage.COLLECT: Stage.SHARE_KEYS, Stage.CONSISTENCY: Stage.COLLECT,
            Stage.UNMASK: Stage.CONSISTENCY}


class SecAggRefusal(ValueError):
    """The node will not answer this stage (one-line reason); the round is aborted for it."""


@dataclass(frozen=True)
class Requirements:
    """What the node's policy demands of a secure sum (``NodePolicy.min_cohort``,
    ``min_survivors``, ``max_colluders``, ``min_secagg_neighbours``: None demands the full graph;
    ``identity``: its consortium identity, and every peer certified by the same CA; None: peers
    are whatever keys the server relays, a trust the node's policy declares)."""

    min_cohort: int
    min_survivors: int
    max_colluders: int
    min_neighbours: int | None = None
    identity: Identity | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_survivors <= self.min_cohort or self.max_colluders < 0:
            raise ValueError("requirements need 1 <= min_survivors <= min_cohort and max_colluders >= 0")
        if self.min_neighbours is not None and self.min_neighbours < 1:
            raise ValueError("requirements need min_neighbours >= 1 (or None: the full graph)")


@dataclass(frozen=True)
class StageInfo:
    """What the node saw of the round when it is asked for its vector."""

    node_id: int
    round_key: str
    cohort_size: int
    threshold: int
    modulus_bits: int
    dimension: int
    senders: int
    """Cohort members (itself included) whose shares it holds: the most that can survive."""


@dataclass(frozen=True)
class Vector:
    """A node's input to the secure sum: ``values`` (integers, length ``dimension``, taken mod
    2^bits) and the ``settings`` (JSON values) they were computed under, bound into the sum."""

    values: np.ndarray
    settings: Mapping[str, Any]


@dataclass
class NodeState:
    """Everything a node keeps between stages; every field is a ConfigRecord value."""

    stage: str = ""
    node_id: int = 0
    round_key: str = ""
    threshold: int = 0
    modulus_bits: int = 0
    dimension: int = 0
    sk1: bytes = b""
    sk2: bytes = b""
    sk3: bytes = b""
    pk1: bytes = b""
    pk2: bytes = b""
    pk3: bytes = b""
    seed: bytes = b""
    settings: bytes = b""  # the round's settings digest, from the collect stage on
    cohort: list[int] = field(default_factory=list)
    group: list[int] = field(default_factory=list)  # whom it shares with, itself included
    group_pk1: list[bytes] = field(default_factory=list)
    group_pk2: list[bytes] = field(default_factory=list)
    group_pk3: list[bytes] = field(default_factory=list)
    signed: list[int] = field(default_factory=list)  # the survivors it signed
    holders: list[int] = field(default_factory=list)  # whose shares it holds (itself first)
    seed_shares: list[bytes] = field(default_factory=list)
    sk1_shares: list[bytes] = field(default_factory=list)

    def to_record(self) -> ConfigRecord:
        return ConfigRecord({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_record(cls, record: ConfigRecord | None) -> NodeState:
        if record is None:
            return cls()
        values: dict[str, Any] = {f.name: record[f.name] for f in fields(cls) if f.name in record}
        return cls(**values)

    def erase(self) -> None:
        """Forget the round's secrets and every share held (after unmasking, or on abort)."""
        self.sk1 = self.sk2 = self.sk3 = self.seed = b""
        self.holders, self.seed_shares, self.sk1_shares = [], [], []


Contribute = Callable[[StageInfo], Vector]


def answer(state: NodeState, requirements: Requirements, node_id: int, config: Mapping[str, Any],
           contribute: Contribute) -> dict[str, Any]:
    """The node's reply to one stage's ``config`` from the server; ``contribute`` gives its
    vector and settings once every check of the collect stage passed. Any refusal or error
    aborts the round in ``state``."""
    try:
        stage = _next_stage(state, config)
        if stage is Stage.SETUP:
            return _setup(state, requirements, node_id, config)
        if stage is Stage.SHARE_KEYS:
            return _share_keys(state, requirements, config)
        if stage is Stage.COLLECT:
            return _collect(state, requirements, config, contribute)
        if stage is Stage.CONSISTENCY:
            return _consistency(state, requirements, config)
        return _unmask(state, requirements, config)
    except BaseException:
        state.stage = ABORTED
        state.erase()
        raise


def _refuse(reason: str) -> SecAggRefusal:
    return SecAggRefusal(f"secure aggregation refused: {reason}")


def _next_stage(state: NodeState, config: Mapping[str, Any]) -> Stage:
    try:
        stage = Stage(str(config.get(s.STAGE)))
    except ValueError:
        raise _refuse(f"unknown stage {config.get(s.STAGE)!r}") from None
    if stage is not Stage.SETUP and state.stage != PREVIOUS[stage]:
        raise _refuse(f"stage {stage} after {state.stage or 'nothing'}: each stage is answered once, in order")
    state.stage = stage
    return stage


def _field(config: Mapping[str, Any], name: str, kind: type) -> Any:
    value = config.get(name)
    if type(value) is not kind:  # bool is not an int here
        raise _refuse(f"{name} must be {kind.__name__}")
    return value


def _list(config: Mapping[str, Any], name: str, kind: type) -> list[Any]:
    return s.typed_list(config, name, kind, _refuse)


def _distinct(values: Sequence[Any], name: str) -> set[Any]:
    unique = set(values)
    if len(unique) != len(values):
        raise _refuse(f"{name} has repeated entries")
    return unique


def _setup(state: NodeState, req: Requirements, node_id: int, config: Mapping[str, Any]) -> dict[str, Any]:
    round_key = _field(config, s.ROUND_KEY, str)
    if not 0 < len(round_key) <= s.MAX_ROUND_KEY:
        raise _refuse(f"a round key has 1 to {s.MAX_ROUND_KEY} characters")
    if round_key == state.round_key:
        raise _refuse(f"round {round_key!r} was set up before: a replayed round is not answered")
    threshold, bits = _field(config, s.THRESHOLD, int), _field(config, s.MODULUS_BITS, int)
    dimension = _field(config, s.DIMENSION, int)
    if threshold < 1 or not 1 <= bits <= prg.MAX_BITS or not 1 <= dimension <= s.MAX_DIMENSION:
        raise _refuse(f"threshold >= 1, modulus bits in [1, {prg.MAX_BITS}] and dimension in "
                      f"[1, {s.MAX_DIMENSION}] are needed")
    state.erase()
    state.node_id, state.round_key, state.threshold, state.modulus_bits, state.dimension = (
        node_id, round_key, threshold, bits, dimension)
    (sk1, pk1), (sk2, pk2), (sk3, pk3) = generate_key_pairs(), generate_key_pairs(), generate_key_pairs()
    state.sk1, state.pk1 = private_key_to_bytes(sk1), public_key_to_bytes(pk1)
    state.sk2, state.pk2 = private_key_to_bytes(sk2), public_key_to_bytes(pk2)
    state.sk3, state.pk3 = private_key_to_bytes(sk3), public_key_to_bytes(pk3)
    state.cohort, state.group, state.signed = [], [], []
    state.group_pk1, state.group_pk2, state.group_pk3 = [], [], []
    state.settings = b""
    identity = {} if req.identity is None else {
        s.CERTIFICATE: req.identity.certificate,
        s.KEYS_SIGNATURE: req.identity.sign(keys.keys_digest(round_key, node_id, state.pk1, state.pk2, state.pk3))}
    return {s.PK1: state.pk1, s.PK2: state.pk2, s.PK3: state.pk3, **identity}


def _share_keys(state: NodeState, req: Requirements, config: Mapping[str, Any]) -> dict[str, Any]:
    ids, pk1s, pk2s = _list(config, s.IDS, int), _list(config, s.PK1, bytes), _list(config, s.PK2, bytes)
    pk3s = _list(config, s.PK3, bytes)
    if not len(ids) == len(pk1s) == len(pk2s) == len(pk3s):
        raise _refuse("ids and keys differ in length")
    group = _distinct(ids, "the cohort")
    _distinct(pk1s + pk2s + pk3s, "the cohort's public keys")
    cohort = _list(config, s.COHORT, int) if s.COHORT in config else ids
    n, t = len(ids), state.threshold
    if state.node_id not in ids:
        raise _refuse("this node is not in the cohort")
    own = ids.index(state.node_id)
    if (pk1s[own], pk2s[own], pk3s[own]) != (state.pk1, state.pk2, state.pk3):
        raise _refuse("this node's own public keys were altered")
    if not group <= _distinct(cohort, "the cohort"):
        raise _refuse("a neighbour is not in the cohort")
    if len(cohort) < req.min_cohort:
        raise _refuse(f"a cohort of {len(cohort)} is below this node's minimum of {req.min_cohort}")
    if n < len(cohort) and req.min_neighbours is None:
        raise _refuse(f"{n - 1} of the cohort's {len(cohort) - 1} others as neighbours: this node's policy "
                      "demands the full graph (no min-secagg-neighbours)")
    if n < len(cohort) and n - 1 < (req.min_neighbours or 0):
        raise _refuse(f"{n - 1} neighbours are below this node's minimum of {req.min_neighbours}")
    if n < len(cohort) and _harary_group(cohort, n - 1, state.round_key, state.node_id) != group:
        raise _refuse("its group is not its neighbourhood in the round's Harary graph")
    group_name = "cohort" if n == len(cohort) else "group"
    if not req.max_colluders < t <= n:
        raise _refuse(f"threshold {t} must exceed the {req.max_colluders} tolerated colluders and be at most "
                      f"the {group_name} of {n}")
    if 2 * t <= n + req.max_colluders:
        raise _refuse(f"threshold {t} must exceed ({group_name} {n} + colluders {req.max_colluders}) / 2")
    try:
        peers = {nid: (keys.public_key(a), keys.public_key(b), keys.public_key(c))
                 for nid, a, b, c in zip(ids, pk1s, pk2s, pk3s, strict=True)}
    except ValueError:
        raise _refuse("a cohort key is not a PEM P-384 key") from None
    if req.identity is not None:
        _check_identities(state, req.identity, config, cohort, {nid: (a, b, c) for nid, a, b, c in
                                                               zip(ids, pk1s, pk2s, pk3s, strict=True)})
    order = sorted(ids)
    state.cohort, state.group = sorted(cohort), order
    state.group_pk1 = [pk1s[ids.index(nid)] for nid in order]
    state.group_pk2 = [pk2s[ids.index(nid)] for nid in order]
    state.group_pk3 = [pk3s[ids.index(nid)] for nid in order]
    state.seed = os.urandom(32)
    seed_shares = create_shares(state.seed, t, n)
    sk1_shares = create_shares(keys.scalar(state.sk1), t, n)
    sk2 = bytes_to_private_key(state.sk2)
    destinations, ciphertexts = [], []
    for index, nid in enumerate(order):
        if nid == state.node_id:
            state.holders, state.seed_shares, state.sk1_shares = [nid], [seed_shares[index]], [sk1_shares[index]]
            continue
        plaintext = share_keys_plaintext_concat(state.node_id, nid, seed_shares[index], sk1_shares[index])
        destinations.append(nid)
        ciphertexts.append(encrypt(generate_shared_key(sk2, peers[nid][1]), plaintext))
    return {s.DESTINATIONS: destinations, s.CIPHERTEXTS: ciphertexts,
            s.COMMITMENT: keys.commitment(state.round_key, state.seed)}


def _harary_group(cohort: list[int], neighbours: int, round_key: str, node_id: int) -> set[int] | None:
    """The node and its neighbours in the round's H(|cohort|, k); None where k is no Harary degree."""
    try:
        drawn = graph.harary(cohort, neighbours, round_key)
    except ValueError:
        return None
    return None if drawn is None else {node_id, *drawn[node_id]}


def _check_identities(state: NodeState, identity: Identity, config: Mapping[str, Any], cohort: list[int],
                      group_keys: Mapping[int, tuple[bytes, bytes, bytes]]) -> None:
    """Refuse unless every cohort member's keys of the round (its group's as received, the
    others' by the digest sent beside them) are signed by a distinct identity that this
    node's CA certifies, its own identity its own."""
    certificates, signatures = _list(config, s.CERTIFICATES, bytes), _list(config, s.KEYS_SIGNATURES, bytes)
    digests = _list(config, s.KEYS_DIGESTS, bytes) if s.KEYS_DIGESTS in config else []
    if len(certificates) != len(cohort) or len(signatures) != len(cohort) or digests and len(digests) != len(cohort):
        raise _refuse("the cohort's identities and the cohort differ in length")
    seen: set[bytes] = set()
    for index, nid in enumerate(cohort):
        if nid in group_keys:
            digest = keys.keys_digest(state.round_key, nid, *group_keys[nid])
            if digests and digests[index] != digest:
                raise _refuse(f"the keys of node {nid} are not the keys their digest names")
        elif digests:
            digest = digests[index]
        else:
            raise _refuse(f"node {nid} of the cohort comes without the digest of its keys")
        if nid == state.node_id and certificates[index] != identity.certificate:
            raise _refuse("this node's own identity was altered")
        try:
            who = peer_identity(identity.ca, certificates[index], signatures[index], digest)
        except ValueError as err:
            raise _refuse(f"node {nid} is not certified by this node's consortium CA: {err}") from None
        if who in seen:
            raise _refuse(f"node {nid} has the identity of another cohort member: one identity counts once")
        seen.add(who)


def _collect(state: NodeState, req: Requirements, config: Mapping[str, Any], contribute: Contribute) -> dict[str, Any]:
    sources, ciphertexts = _list(config, s.SOURCES, int), _list(config, s.CIPHERTEXTS, bytes)
    if len(sources) != len(ciphertexts):
        raise _refuse("sources and ciphertexts differ in length")
    others = _distinct(sources, "the sources")
    if not others <= set(state.group) - {state.node_id}:
        raise _refuse("shares from a node outside its group (or from itself)")
    needed = max(min(req.min_survivors, len(state.group)), state.threshold)
    if len(sources) + 1 < needed:
        raise _refuse(f"only {len(sources)} other nodes sent shares; this node needs {needed - 1}")
    sk2 = bytes_to_private_key(state.sk2)
    for src, ciphertext in zip(sources, ciphertexts, strict=True):
        peer_pk2 = keys.public_key(state.group_pk2[state.group.index(src)])
        try:
            plaintext = decrypt(generate_shared_key(sk2, peer_pk2), ciphertext)
        except InvalidToken:
            raise _refuse(f"the shares from node {src} do not decrypt") from None
        sender, receiver, seed_share, sk1_share = share_keys_plaintext_separate(plaintext)
        if (sender, receiver) != (src, state.node_id) or not seed_share or not sk1_share:
            raise _refuse(f"the shares from node {src} are not its shares for this node")
        state.holders.append(src)
        state.seed_shares.append(seed_share)
        state.sk1_shares.append(sk1_share)
    info = StageInfo(state.node_id, state.round_key, len(state.cohort), state.threshold, state.modulus_bits,
                     state.dimension, len(state.holders))
    contribution = contribute(info)
    vector = np.asarray(contribution.values)
    if vector.shape != (state.dimension,) or vector.dtype.kind not in "ui":
        raise ValueError(f"the contribution must be an integer vector of length {state.dimension}")
    state.settings = round_settings(state, contribution.settings)
    return {s.MASKED: prg.to_wire(masked(state, vector, sources), state.modulus_bits), s.SETTINGS: state.settings}


def round_settings(state: NodeState, settings: Mapping[str, Any]) -> bytes:
    """The digest of everything the node's vector and its masking depend on: the secure sum's
    round key, threshold, modulus, dimension, cohort and graph (k neighbours, 0: full), and
    ``settings``, the contribution's."""
    neighbours = 0 if len(state.group) == len(state.cohort) else len(state.group) - 1
    return keys.settings_digest({"secure-sum": {"round-key": state.round_key, "threshold": state.threshold,
                                                "modulus-bits": state.modulus_bits, "dimension": state.dimension,
                                                "cohort": state.cohort, "neighbours": neighbours},
                                 "contribution": dict(settings)})


def masked(state: NodeState, vector: np.ndarray, neighbours: Sequence[int]) -> np.ndarray:
    """(vector + PRG(b) + Σ_v ±PRG(s_uv)) mod 2^bits: + for a neighbour of smaller id, - else;
    s_uv keyed by the round's settings digest."""
    bits, d, round_key = state.modulus_bits, state.dimension, state.round_key
    total = prg.reduce(vector, bits) + prg.mask(state.seed, "private", round_key, d, bits)
    sk1 = bytes_to_private_key(state.sk1)
    for nid in neighbours:
        key = keys.mask_key(sk1, keys.public_key(state.group_pk1[state.group.index(nid)]), state.settings)
        pairwise = prg.mask(key, "pairwise", round_key, d, bits)
        total = total + pairwise if state.node_id > nid else total - pairwise
    return prg.reduce(total, bits)


def _survivors(state: NodeState, req: Requirements, active: list[int]) -> set[int]:
    """``active`` as a set, refused unless it is a list of survivors this node can stand by."""
    survivors = _distinct(active, "the active list")
    if not survivors <= set(state.cohort):
        raise _refuse("a listed node is outside the cohort")
    if state.node_id not in survivors:
        raise _refuse("this node, which sent its vector, is not listed active")
    if not survivors & set(state.group) <= set(state.holders):
        raise _refuse("a listed node sent this node no shares")
    if len(survivors) < req.min_survivors:
        raise _refuse(f"{len(survivors)} active nodes; this node needs at least {req.min_survivors}")
    if len(survivors & set(state.group)) < state.threshold:
        raise _refuse(f"{len(survivors & set(state.group))} active nodes of its group; this node needs at least "
                      f"its threshold of {state.threshold}")
    return survivors


def _consistency(state: NodeState, req: Requirements, config: Mapping[str, Any]) -> dict[str, Any]:
    active = _list(config, s.ACTIVE, int)
    _survivors(state, req, active)
    state.signed = sorted(active)
    message = keys.survivors_message(state.round_key, state.signed, state.settings)
    return {s.SIGNATURE: sign_message(bytes_to_private_key(state.sk3), message)}


def _unmask(state: NodeState, req: Requirements, config: Mapping[str, Any]) -> dict[str, Any]:
    active, dead = _list(config, s.ACTIVE, int), _list(config, s.DEAD, int)
    signers, signatures = _list(config, s.SIGNERS, int), _list(config, s.SIGNATURES, bytes)
    active_set, dead_set = _survivors(state, req, active), _distinct(dead, "the dead list")
    if active_set & dead_set:
        raise _refuse(f"nodes {sorted(active_set & dead_set)} are listed both active and dead")
    if not dead_set <= set(state.holders):
        raise _refuse("a listed node is outside the cohort or sent this node no shares")
    if sorted(active) != state.signed:
        raise _refuse("the active list is not the list of survivors this node signed")
    if len(signers) != len(signatures) or len(_distinct(signers, "the signers")) < state.threshold:
        raise _refuse(f"the survivors carry fewer than the threshold of {state.threshold} signatures")
    message = keys.survivors_message(state.round_key, state.signed, state.settings)
    for signer, signature in zip(signers, signatures, strict=True):
        if signer not in state.group or not keys.signed(state.group_pk3[state.group.index(signer)], message,
                                                       signature):
            raise _refuse(f"the signature of node {signer} on the survivors and this node's settings does not "
                          "verify (another node given other settings?)")
    index = {nid: i for i, nid in enumerate(state.holders)}
    alive = [nid for nid in active if nid in index]
    shares = [state.seed_shares[index[nid]] for nid in alive] + [state.sk1_shares[index[nid]] for nid in dead]
    state.erase()
    return {s.IDS: alive + dead, s.SHARES: shares}
