"""The server's side of a secure sum, without messaging: each stage's per-node config from
the previous replies, every reply checked (a missing or malformed one drops its node, never
a crash), and the modular sum over the survivors once the masks are removed.

Nodes that answered SETUP form the cohort U1; U2 answered SHARE_KEYS; U3 sent masked vectors
(the survivors); CONSISTENCY has U3 sign U3; UNMASK sends U3 with those signatures and asks
for shares of b of U3 (active) and of sk1 of U2 \\ U3 (dead).
With ``neighbours`` = k (SecAgg+, ``graph``), each node of U1 shares with and masks against
only its neighbours in the round's Harary graph H(|U1|, k), is sent only their keys (and U1's
ids) and asked only for their shares; otherwise every node is every other's neighbour.
A seed or key rebuilt from shares is checked (b against the node's commitment, sk1 against
its public key) before use, so a node sending a wrong share makes the round fail or is
outvoted, never a wrong sum. The server relays each node's identity (certificate and its
signature on the node's keys) to the cohort, and takes the round's settings digest from the
survivors' collect replies: survivors that disagree on it end the round (their masks would
not cancel), and the digest keys the dead nodes' pairwise masks and the signatures checked.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedpriv.secagg import graph, keys, prg
from fedpriv.secagg import stages as s
from fedpriv.secagg.identity import MAX_CERTIFICATE_BYTES
from fedpriv.secagg.lagrange import Interpolator
from fedpriv.secagg.stages import Stage

MAX_TRIES = 64
"""Subsets of t shares tried per secret before the round is given up."""


@dataclass
class SecureSumResult:
    """The modular sum over ``survivors`` (None, with ``reason``, when the round is discarded)."""

    sum: np.ndarray | None
    reason: str | None
    cohort: tuple[int, ...]
    survivors: tuple[int, ...]
    dropped: dict[int, str]
    """Node → why it was left out at some stage (a survivor that failed after sending its
    vector is here too: its vector is still in the sum)."""
    bytes_sent: dict[int, int]
    """Bytes each node sent the server in this round."""
    bytes_received: dict[int, int]
    """Bytes the server sent each node in this round."""
    extras: dict[int, Any] = field(default_factory=dict)
    """What each survivor sent beside its masked vector (filled by a messaging driver)."""


def wire_bytes(record: Mapping[str, Any]) -> int:
    """Payload bytes of a ConfigRecord's values (bytes and str by length, numbers 8)."""
    def size(value: Any) -> int:
        if isinstance(value, list):
            return sum(size(item) for item in value)
        if isinstance(value, bytes):
            return len(value)
        if isinstance(value, str):
            return len(value.encode())
        return 8
    return sum(len(name) + size(value) for name, value in record.items())


class Malformed(ValueError):
    """A reply that does not fit its stage."""


class SecureAggregation:
    """One secure sum over ``nodes``: ``requests()`` for the current stage, ``receive()`` its
    replies, until ``done``; then ``result()``."""

    def __init__(self, nodes: Sequence[int], *, dimension: int, modulus_bits: int, threshold: int,
                 round_key: str, neighbours: int = 0) -> None:
        if not 1 <= modulus_bits <= prg.MAX_BITS or not 1 <= dimension <= s.MAX_DIMENSION or threshold < 1:
            raise ValueError("modulus_bits in [1, 64], dimension in [1, 2^28] and threshold >= 1 are needed")
        if len(set(nodes)) != len(nodes):
            raise ValueError("nodes are repeated")
        self.nodes = tuple(sorted(nodes))
        self.dimension, self.modulus_bits = dimension, modulus_bits
        self.threshold, self.round_key = threshold, round_key
        graph.harary(self.nodes, neighbours, round_key)  # an odd k fails here, not mid-round
        self.neighbours = neighbours
        self.graph: dict[int, frozenset[int]] | None = None  # drawn over U1; None: the full graph
        self.stage: Stage | None = Stage.SETUP
        self.live: list[int] = list(self.nodes)
        self.dropped: dict[int, str] = {}
        self.reason: str | None = None
        self.pk1: dict[int, bytes] = {}
        self.pk2: dict[int, bytes] = {}
        self.pk3: dict[int, bytes] = {}
        self.identities: dict[int, tuple[bytes, bytes]] = {}  # node → (certificate, signature on its keys)
        self.settings: dict[int, bytes] = {}  # survivor → the settings digest it sent
        self.signatures: dict[int, bytes] = {}
        self.commitments: dict[int, bytes] = {}
        self.inbox: dict[int, tuple[list[int], list[bytes]]] = {}  # receiver → (sources, ciphertexts)
        self.shared: list[int] = []  # U2
        self.vectors: dict[int, np.ndarray] = {}
        self.shares: dict[int, list[bytes]] = {}
        self.asked: dict[int, list[int]] = {}
        self.survivors: tuple[int, ...] = ()  # U3
        self.asked_now: list[int] = []  # the nodes the current stage went to
        self.bytes_sent = {node: 0 for node in self.nodes}
        self.bytes_received = {node: 0 for node in self.nodes}
        self.interpolator = Interpolator()  # λ shared by the secrets shared at the same indices

    @property
    def done(self) -> bool:
        return self.stage is None

    def requests(self) -> dict[int, dict[str, Any]]:
        """Node → the config of the current stage (the stage's name included)."""
        stage = self.current()
        build = {Stage.SETUP: self._setup_config, Stage.SHARE_KEYS: self._share_keys_config,
                 Stage.COLLECT: self._collect_config, Stage.CONSISTENCY: self._consistency_config,
                 Stage.UNMASK: self._unmask_config}[stage]
        configs = {node: {s.STAGE: str(stage), **build(node)} for node in self.live}
        self.asked_now = list(configs)  # what each reply of this stage is checked against
        for node, config in configs.items():
            self.bytes_received[node] += wire_bytes(config)
        if stage is Stage.UNMASK:
            self.asked = {node: [n for n in config[s.ACTIVE] if self.linked(node, n)] + config[s.DEAD]
                          for node, config in configs.items()}
        return configs

    def current(self) -> Stage:
        """The stage under way (RuntimeError once the sum is over)."""
        if self.stage is None:
            raise RuntimeError("this secure sum is over")
        return self.stage

    def drop(self, node: int, reason: str) -> None:
        """Leave ``node`` out from now on (the caller saw it fail)."""
        if node in self.live:
            self.live.remove(node)
            self.dropped[node] = reason

    def receive(self, replies: Mapping[int, Mapping[str, Any]]) -> None:
        """Take the current stage's replies (node → its config); a node of ``live`` without a
        valid one is dropped. Moves to the next stage, or ends the round."""
        stage = self.current()
        accept = {Stage.SETUP: self._accept_setup, Stage.SHARE_KEYS: self._accept_share_keys,
                  Stage.COLLECT: self._accept_collect, Stage.CONSISTENCY: self._accept_consistency,
                  Stage.UNMASK: self._accept_unmask}[stage]
        for node in self.asked_now:
            if node not in self.live:  # dropped by the caller meanwhile (it refused)
                continue
            reply = replies.get(node)
            if reply is None:
                self.drop(node, f"no reply at {stage}")
                continue
            self.bytes_sent[node] += wire_bytes(reply)
            try:
                accept(node, reply)
            except Malformed as err:
                self.drop(node, f"malformed {stage} reply: {err}")
        if stage is Stage.SETUP:
            self._drop_repeated_keys()
            self.graph = graph.harary(self.live, self.neighbours, self.round_key)
        if stage is Stage.SHARE_KEYS:
            self.shared = list(self.live)
        if stage is Stage.COLLECT:
            self.survivors = tuple(self.live)
            if len({self.settings[n] for n in self.survivors}) > 1:
                self.reason = "the survivors computed their vectors under different settings (their digests differ)"
                self.stage = None
                return
        if stage is Stage.UNMASK:
            self.stage = None
            return
        if len(self.live) < self.threshold:
            self.reason = f"{len(self.live)} of {len(self.nodes)} nodes left after {stage}, threshold {self.threshold}"
        elif stage is Stage.COLLECT:
            self.reason = self._unrecoverable()
        if self.reason is not None:
            self.stage = None
            return
        self.stage = list(Stage)[list(Stage).index(stage) + 1]

    def linked(self, node: int, other: int) -> bool:
        """Whether ``node`` shares with and masks against ``other`` (itself included)."""
        return self.graph is None or node == other or other in self.graph[node]

    def _unrecoverable(self) -> str | None:
        """Why a survivor's seed or a dead node's key cannot be rebuilt on a sparse graph: fewer
        than t of its group survived (on the full graph, fewer than t survivors end the round
        before this is asked)."""
        for node in self.shared if self.graph is not None else ():
            holders = sum(self.linked(node, peer) for peer in self.survivors)
            if holders < self.threshold:
                return f"node {node} has {holders} surviving neighbours (itself included), threshold {self.threshold}"
        return None

    # -- configs
    def _setup_config(self, node: int) -> dict[str, Any]:
        return {s.THRESHOLD: self.threshold, s.MODULUS_BITS: self.modulus_bits, s.DIMENSION: self.dimension,
                s.ROUND_KEY: self.round_key}

    def _share_keys_config(self, node: int) -> dict[str, Any]:
        group = [n for n in self.live if self.linked(node, n)]
        cohort = {} if self.graph is None else {
            s.COHORT: list(self.live),
            s.KEYS_DIGESTS: [keys.keys_digest(self.round_key, n, self.pk1[n], self.pk2[n], self.pk3[n])
                             for n in self.live]}
        return {s.IDS: group, s.PK1: [self.pk1[n] for n in group], s.PK2: [self.pk2[n] for n in group],
                s.PK3: [self.pk3[n] for n in group], **cohort,
                s.CERTIFICATES: [self.identities[n][0] for n in self.live],
                s.KEYS_SIGNATURES: [self.identities[n][1] for n in self.live]}

    def _collect_config(self, node: int) -> dict[str, Any]:
        sources, ciphertexts = self.inbox.get(node, ([], []))
        pairs = [(src, c) for src, c in zip(sources, ciphertexts, strict=True) if src in self.live]
        return {s.SOURCES: [src for src, _ in pairs], s.CIPHERTEXTS: [c for _, c in pairs]}

    def _consistency_config(self, node: int) -> dict[str, Any]:
        return {s.ACTIVE: list(self.survivors)}

    def _unmask_config(self, node: int) -> dict[str, Any]:
        signers = [n for n in self.live if self.linked(node, n)]
        return {s.ACTIVE: list(self.survivors),
                s.DEAD: [n for n in self.shared if n not in self.survivors and self.linked(node, n)],
                s.SIGNERS: signers, s.SIGNATURES: [self.signatures[n] for n in signers]}

    # -- replies
    def _accept_setup(self, node: int, reply: Mapping[str, Any]) -> None:
        try:
            for name in (s.PK1, s.PK2, s.PK3):
                keys.public_key(reply.get(name))
        except ValueError as err:
            raise Malformed(str(err)) from None
        self.pk1[node], self.pk2[node], self.pk3[node] = reply[s.PK1], reply[s.PK2], reply[s.PK3]
        certificate, signature = reply.get(s.CERTIFICATE, b""), reply.get(s.KEYS_SIGNATURE, b"")
        if not isinstance(certificate, bytes) or not isinstance(signature, bytes) or \
                len(certificate) > MAX_CERTIFICATE_BYTES or len(signature) > s.MAX_SIGNATURE_BYTES:
            raise Malformed("an identity is a certificate and a signature, as bytes")
        self.identities[node] = (certificate, signature)

    def _drop_repeated_keys(self) -> None:
        holders: dict[bytes, list[int]] = {}
        for node in self.live:
            for key in (self.pk1[node], self.pk2[node], self.pk3[node]):
                holders.setdefault(key, []).append(node)
        for owners in holders.values():
            if len(owners) > 1:
                for node in owners:
                    self.drop(node, "malformed setup reply: a public key another node also sent")

    def _accept_share_keys(self, node: int, reply: Mapping[str, Any]) -> None:
        destinations, ciphertexts = _list(reply, s.DESTINATIONS, int), _list(reply, s.CIPHERTEXTS, bytes)
        commitment = reply.get(s.COMMITMENT)
        group = [n for n in self.asked_now if n != node and self.linked(node, n)]
        if sorted(destinations) != group or len(ciphertexts) != len(destinations):
            raise Malformed("shares for other nodes than its group")
        if any(len(c) > s.MAX_CIPHERTEXT_BYTES for c in ciphertexts):
            raise Malformed("a ciphertext is too long")
        if not isinstance(commitment, bytes) or len(commitment) != 32:
            raise Malformed("no 32-byte commitment")
        self.commitments[node] = commitment
        for dst, ciphertext in zip(destinations, ciphertexts, strict=True):
            sources, texts = self.inbox.setdefault(dst, ([], []))
            sources.append(node)
            texts.append(ciphertext)

    def _accept_collect(self, node: int, reply: Mapping[str, Any]) -> None:
        settings = reply.get(s.SETTINGS)
        if not isinstance(settings, bytes) or len(settings) != 32:
            raise Malformed("no 32-byte settings digest")
        try:
            self.vectors[node] = prg.from_wire(reply.get(s.MASKED), self.dimension, self.modulus_bits)
        except ValueError as err:
            raise Malformed(str(err)) from None
        self.settings[node] = settings

    def _accept_consistency(self, node: int, reply: Mapping[str, Any]) -> None:
        signature = reply.get(s.SIGNATURE)
        message = keys.survivors_message(self.round_key, list(self.survivors), self.settings[self.survivors[0]])
        if not isinstance(signature, bytes) or len(signature) > s.MAX_SIGNATURE_BYTES or not keys.signed(
                self.pk3[node], message, signature):
            raise Malformed("no valid signature on the survivors")
        self.signatures[node] = signature

    def _accept_unmask(self, node: int, reply: Mapping[str, Any]) -> None:
        ids, shares = _list(reply, s.IDS, int), _list(reply, s.SHARES, bytes)
        if ids != self.asked[node] or len(shares) != len(ids):
            raise Malformed("shares of other nodes than asked")
        if any(not 4 < len(share) <= s.MAX_SHARE_BYTES for share in shares):
            raise Malformed("a share of the wrong size")
        for owner, share in zip(ids, shares, strict=True):
            self.shares.setdefault(owner, []).append(share)

    # -- the sum
    def result(self) -> SecureSumResult:
        """The sum over the survivors, or None with the reason the round is discarded."""
        survivors = self.survivors
        total, reason = None, self.reason
        if reason is None and self.stage is not None:
            reason = f"the round stopped at {self.stage}"
        if reason is None:
            total, reason = self._unmasked(survivors)
        return SecureSumResult(total, reason, self.nodes, survivors if total is not None else (),
                               dict(self.dropped), dict(self.bytes_sent), dict(self.bytes_received))

    def _unmasked(self, survivors: tuple[int, ...]) -> tuple[np.ndarray | None, str | None]:
        bits, d, round_key = self.modulus_bits, self.dimension, self.round_key
        dead = [n for n in self.shared if n not in survivors]
        settings = self.settings[survivors[0]]  # every survivor's (``receive``)
        total = np.zeros(d, dtype=np.uint64)
        for node in survivors:
            total += self.vectors[node]
        for node in survivors:
            seed = self._seed(node)
            if seed is None:
                return None, f"the mask seed of node {node} could not be rebuilt from the shares"
            total -= prg.mask(seed, "private", round_key, d, bits)
        for node in dead:
            secret = self._key(node)
            if secret is None:
                return None, f"the key of dropped node {node} could not be rebuilt from the shares"
            private = keys.private_key(secret)
            for peer in (p for p in survivors if self.linked(node, p)):
                key = keys.mask_key(private, keys.public_key(self.pk1[peer]), settings)
                pairwise = prg.mask(key, "pairwise", round_key, d, bits)
                if node > peer:  # the peer subtracted it
                    total += pairwise
                else:
                    total -= pairwise
        return prg.reduce(total, bits), None

    def _seed(self, node: int) -> bytes | None:
        return self._rebuild(node, lambda b: keys.commitment(self.round_key, b) == self.commitments[node])

    def _key(self, node: int) -> bytes | None:
        return self._rebuild(node, lambda k: keys.matches(k, self.pk1[node]))

    def _rebuild(self, owner: int, valid: Callable[[bytes], bool]) -> bytes | None:
        """The secret of ``owner`` from t of its shares that pass ``valid``; subsets of t tried
        in order, then at random (a few wrong shares are outvoted), at most ``MAX_TRIES``."""
        shares, t = self.shares.get(owner, []), self.threshold
        if len(shares) < t:
            return None
        ordered = itertools.islice(itertools.combinations(range(len(shares)), t), MAX_TRIES // 2)
        rng = random.Random(owner)  # which subsets to try: nothing secret
        shuffled = (tuple(rng.sample(range(len(shares)), t)) for _ in range(MAX_TRIES // 2))
        for subset in itertools.chain(ordered, shuffled):
            try:
                secret = self.interpolator.combine([shares[i] for i in subset])
            except ValueError:  # malformed shares
                continue
            if valid(secret):
                return secret
        return None


def _list(config: Mapping[str, Any], name: str, kind: type) -> list[Any]:
    return s.typed_list(config, name, kind, Malformed)
