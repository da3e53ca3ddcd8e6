"""``fedpriv-clientapp``: Flower's ``flwr-clientapp`` that runs only app bundles the node pinned.

The ClientApp's code reaches a SuperNode inside the app bundle (FAB) that the server sends.
Flower's own check (``flower-supernode --trusted-entities``) verifies signatures that only
the Flower platform issues, so a locally built app (``flwr run .``) cannot pass it. A check
inside the app would be the app's to skip, so the node enforces the pin here, in code its
operator installed: the SuperNode starts this program in place of ``flwr-clientapp`` (it
finds that name on ``PATH``; ``python -m clients.pinned shim DIR`` writes the link). It
pulls the task as Flower does and, before the bundle is unpacked or any of its code
imported, compares the bundle's SHA-256 with the node policy's ``trusted-apps``. An
untrusted bundle gets an error reply naming its digest; none of its code runs.

``python -m clients.pinned hash [APP]`` prints the digest of the bundle ``flwr run APP``
sends, for the operator to pin after reviewing that code.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedpriv.federation.policy import load_policy

COMMAND = "flwr-clientapp"
"""The program name the SuperNode (through SuperExec) starts for each task."""


class UntrustedApp(RuntimeError):
    """The server sent an app bundle that the node's policy does not pin."""


def app_digest(content: bytes) -> str:
    """SHA-256 of an app bundle, as the policy's ``trusted-apps`` lists it."""
    return hashlib.sha256(content).hexdigest()


def check_trusted(content: bytes, node_config: Mapping[str, Any]) -> None:
    """Raise ``UntrustedApp`` unless the node's policy pins this bundle."""
    digest = app_digest(content)
    trusted = load_policy(node_config).trusted_apps
    if digest not in trusted:
        pinned = ", ".join(trusted) or "none: set trusted-apps in the node policy"
        raise UntrustedApp(f"app bundle sha256 {digest} is not one this node trusts (trusted-apps: {pinned})")


def run() -> None:
    """Flower's ``flwr-clientapp``, with the pin checked between pulling the task and
    installing its bundle (the only two steps before app code can run)."""
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp
    from flwr.supernode.runtime import run_clientapp as runtime

    pull, install = runtime.pull_task_input, runtime.install_from_fab
    pulled: dict[str, Mapping[str, Any]] = {}

    def pull_task_input(client: Any) -> Any:
        message, context, run_info, fab = pull(client)
        pulled["node_config"] = context.node_config
        return message, context, run_info, fab

    def install_from_fab(fab_file: Path | bytes, install_dir: Path | None = None, skip_prompt: bool = False) -> Path:
        if not isinstance(fab_file, bytes):  # the SuperNode installs the bundle it pulled, as bytes
            raise UntrustedApp(f"app bundle from a file ({fab_file}), not the pulled bytes: cannot pin it")
        check_trusted(fab_file, pulled["node_config"])
        _forget(("clients", "fedpriv"))
        return install(fab_file, install_dir, skip_prompt)

    runtime.pull_task_input, runtime.install_from_fab = pull_task_input, install_from_fab
    flwr_clientapp()


def _forget(packages: tuple[str, ...]) -> None:
    """Drop this program's own imports of the app's packages, so that the bundle's code,
    the code that was pinned, is what Flower imports next."""
    for name in [m for m in sys.modules if m.split(".")[0] in packages]:
        del sys.modules[name]


def write_shim(folder: Path) -> Path:
    """``folder/flwr-clientapp`` starting this program; put ``folder`` first on the
    SuperNode's ``PATH``."""
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / COMMAND
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m clients.pinned run "$@"\n')
    shim.chmod(0o755)
    return shim


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m clients.pinned", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    digest = commands.add_parser("hash", help="print the SHA-256 of the bundle `flwr run APP` sends")
    digest.add_argument("app", nargs="?", default=".", type=Path)
    shim = commands.add_parser("shim", help=f"write DIR/{COMMAND}, which runs this program")
    shim.add_argument("dir", type=Path)
    commands.add_parser("run", help=f"act as {COMMAND} (the SuperNode passes its arguments)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "run":
        sys.argv = [COMMAND, *rest]
        run()
    elif args.command == "hash":
        from flwr.cli.build import build_fab_from_disk

        print(app_digest(build_fab_from_disk(args.app)))
    else:
        print(write_shim(args.dir))


if __name__ == "__main__":
    main()
