"""``python -m fedpriv.node init --policy P [--partition-id N]``: make a node's ledger once
(see ``fedpriv.node``); a clear one-line error and exit 2 where it cannot (a second time)."""

from __future__ import annotations

import argparse
import sys

from fedpriv.federation.policy import PolicyError, load_policy
from fedpriv.node import ids_path, init
from fedpriv.privacy import LedgerError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedpriv.node", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser("init", help="make this node's ledger and record its id beside the policy file")
    command.add_argument("--policy", required=True, help="the node's policy file")
    command.add_argument("--partition-id", type=int, help="expands {partition-id} in the policy's state-dir")
    args = parser.parse_args(argv)
    node_config = {"policy": args.policy} | ({} if args.partition_id is None else {"partition-id": args.partition_id})
    try:
        policy = load_policy(node_config, environ={})
        ledger_id = init(policy)
    except (PolicyError, LedgerError, OSError) as err:
        print(f"{parser.prog} init: error: {err}", file=sys.stderr)
        return 2
    assert policy.policy_file is not None
    print(f"initialised ledger {ledger_id} in {policy.state_dir}; its id is recorded in "
          f"{ids_path(policy.policy_file)}: back up both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
