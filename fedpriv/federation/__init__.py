"""The contract between the ServerApp and the ClientApp, in one place: the trust boundary.

- ``settings``: the run config (the server's), parsed and validated.
- ``policy``: a node's own privacy policy (its operator's): budget, δ, state, randomness,
  what may be released. The run config can tighten it, never loosen it.
- ``protocol``: the message records both apps read and write, and the ledger entry keys.
- ``classic_protocol``: the same for the classic algorithms' apps (``server.classic``,
  ``clients.classic.client_app``), and ``Request``, a node's checked reading of one.

``docs/threat-model.md`` says who is trusted with what.
"""
