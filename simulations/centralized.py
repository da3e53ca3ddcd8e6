"""Centralized DP-SGD baseline: ``python -m simulations.centralized --dataset mnist --target-epsilon 1``.

Trains one model on the whole training set, epoch by epoch, with exactly the routine a
Flower client runs (``fedpriv.training.train_round`` with client 0, round = epoch, and the
seed a simulated node with seeded randomness derives for its epoch-th training), so
``python -m simulations.mnist --clients 1 --rounds E --local-epochs 1`` gives the same ε
and the same ``model_sha256``. ε is computed from the events the epochs reported.
Prints one JSON object (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulations._cli import (
    Parser,
    add_cache_dir,
    add_max_physical_batch,
    at_least,
    delta,
    positive,
    report_json,
    use_cache_dir,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from fedpriv.dpsgd.augmentation import Augmentation
    from fedpriv.privacy.events import DpEvent
    from fedpriv.training import TrainingPlan

# torch, the data sets and fedpriv's training are imported once the flags are checked, so
# that a bad flag is one line at once.
DATASETS = ("mnist", "cifar10")
PROG = "python -m simulations.centralized"
SHIFT = 2
"""``--augmult``'s copies: each image shifted by up to this many pixels either way."""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Centralized DP-SGD baseline; prints the result as JSON.",
    )
    p.add_argument("--dataset", choices=DATASETS, default="mnist", help="(default: mnist)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--target-epsilon", type=positive, default=None,
                        help="calibrate σ so the whole run ends at ε <= this (default 1)")
    budget.add_argument("--noise-multiplier", type=positive, help="fixed σ instead of a target ε")
    budget.add_argument("--non-private", action="store_true",
                        help="same schedule without clipping or noise (ε reported as null)")
    p.add_argument("--delta", type=delta, default=1e-5, help="(default: 1e-5)")
    p.add_argument("--epochs", type=at_least(1), help="default: depends on the data set and ε")
    p.add_argument("--model", metavar="NAME", help="a fedpriv.models name (default: the data set's plan)")
    p.add_argument("--lot-size", type=at_least(1), help="expected Poisson lot size")
    p.add_argument("--lr", type=positive)
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], help="default: the data set's plan")
    p.add_argument("--max-grad-norm", type=positive)
    add_max_physical_batch(p)
    p.add_argument("--augmult", type=at_least(1), default=1, metavar="K",
                   help="augmentation multiplicity: each example's gradient is the mean over K randomly "
                        f"shifted copies (up to {SHIFT} pixels), clipped as one; the same ε (default: 1, off)")
    p.add_argument("--private-normalisation", type=positive, metavar="SIGMA",
                   help="normalise each input channel by a private mean and std (Gaussian noise of this "
                        "multiplier on clipped statistics), its cost composed into ε (default: off)")
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.add_argument("--data-dir", help="root folder of the data sets (default ~/.cache/fedpriv)")
    p.add_argument("--download", action="store_true", help="download the data set if missing")
    p.add_argument("--limit-train", type=at_least(1), help="use the first N training examples")
    p.add_argument("--out", type=Path, help="also write the JSON result to this file")
    add_cache_dir(p)
    return p


def plan_from_args(args: argparse.Namespace) -> TrainingPlan:
    """The data set's default plan with the flags' overrides (σ not yet calibrated)."""
    from fedpriv.training import default_plan

    plan = default_plan(args.dataset, model=args.model, lot_size=args.lot_size, lr=args.lr,
                        lr_schedule=args.lr_schedule, max_grad_norm=args.max_grad_norm,
                        noise_multiplier=args.noise_multiplier, max_physical_batch_size=args.max_physical_batch)
    return plan.non_private() if args.non_private else plan


def run(args: argparse.Namespace, plan: TrainingPlan) -> dict[str, Any]:
    """Train ``plan`` (σ calibrated here unless fixed) and evaluate; the JSON-ready result."""
    from tqdm.auto import tqdm

    from fedpriv.data import load_dataset
    from fedpriv.models import build_model, model_inputs, model_sha256
    from fedpriv.privacy import ComposedEvent, epsilon_of
    from fedpriv.seeding import SIMULATION_RUN_ID, generator, seeded_training_seed
    from fedpriv.training import (
        calibrate_plan,
        default_device,
        default_epochs,
        evaluate,
        train_round,
        with_physical_batch,
    )
    from fedpriv.training.normalisation import normalisation_events, private_normalisation

    device = default_device()
    train = load_dataset(args.dataset, args.data_dir, train=True, download=args.download,
                         device=device, limit=args.limit_train)
    test = load_dataset(args.dataset, args.data_dir, train=False, download=args.download, device=device)
    start = time.perf_counter()
    train_inputs, test_inputs = (model_inputs(plan.model, part.features) for part in (train, test))
    feature_seconds = time.perf_counter() - start
    num_examples = len(train.labels)
    prior: tuple[DpEvent, ...] = ()
    normalise = None
    if args.private_normalisation is not None:  # before σ is calibrated: its cost is part of ε
        normalise = private_normalisation(train_inputs, args.private_normalisation,
                                          generator(args.seed, "normalisation", device=device))
        train_inputs, test_inputs = normalise(train_inputs), normalise(test_inputs)
        prior = normalisation_events(args.private_normalisation)
    if plan.lot_size > num_examples:
        print(f"{PROG}: note: lot size {plan.lot_size} > {num_examples} training examples: every "
              f"example is in every lot (q = 1); reported as expected lot {num_examples}", file=sys.stderr)
    if not args.non_private and args.noise_multiplier is None:
        target = 1.0 if args.target_epsilon is None else args.target_epsilon
        epochs = args.epochs or default_epochs(args.dataset, target)
        plan = calibrate_plan(plan, target, args.delta, num_examples, rounds=epochs, prior_events=prior)
    else:
        epochs = args.epochs or default_epochs(args.dataset, None)

    plan = dataclasses.replace(plan, lr_decay_rounds=epochs)
    model = build_model(plan.model, args.seed).to(device)
    augment = augmentation(args.augmult, plan.model, train.features, normalise)
    examples = train_inputs if augment is None else train.features  # augmented copies are made from the images
    plan = with_physical_batch(plan, model, examples, device, augment=augment(0) if augment else None)  # once
    start = time.perf_counter()
    events: list[DpEvent] = list(prior)
    bar = tqdm(range(1, epochs + 1), desc="epochs", disable=not sys.stderr.isatty())
    for epoch in bar:
        seed = seeded_training_seed(args.seed, SIMULATION_RUN_ID, ordinal=epoch - 1)  # as a simulated node's
        report = train_round(model, examples, train.labels, plan, seed=seed, client=0, round_=epoch, device=device,
                             augment=augment(seed) if augment else None)
        events.extend(report.events)
        bar.set_postfix(loss=f"{report.mean_loss:.3f}")
    seconds = time.perf_counter() - start
    _, accuracy = evaluate(model, test_inputs, test.labels)
    epsilon = epsilon_of(ComposedEvent(tuple(events)), args.delta) if plan.private else None
    return {
        "dataset": args.dataset,
        "model": plan.model,
        "private": plan.private,
        "accuracy": accuracy,
        "epsilon": epsilon,
        "delta": args.delta,
        "noise_multiplier": plan.noise_multiplier,
        "max_grad_norm": plan.max_grad_norm if plan.private else None,
        "sample_rate": plan.sample_rate(num_examples),
        "lot_size": plan.lot_size,
        "expected_lot_size": plan.sample_rate(num_examples) * num_examples,
        "lr": plan.lr,
        "max_physical_batch": plan.max_physical_batch_size,
        "augmult": args.augmult,
        "private_normalisation": args.private_normalisation,
        "epochs": epochs,
        "steps": epochs * plan.steps_per_round(num_examples),
        "num_examples": num_examples,
        "seed": args.seed,
        "seconds": round(seconds, 2),
        "feature_seconds": round(feature_seconds, 2),
        "model_sha256": model_sha256(model),
    }


def augmentation(
    multiplicity: int, model: str, images: torch.Tensor, normalise: Callable[[torch.Tensor], torch.Tensor] | None
) -> Callable[[int], Augmentation] | None:
    """None for K = 1, else ``make(seed)``: the ``Augmentation`` of one epoch, its shifts drawn
    from that epoch's own stream; each copy goes through the model's feature map (scattering:
    computed per step, uncached) and ``normalise``."""
    from fedpriv.dpsgd.augmentation import Augmentation, random_shift
    from fedpriv.features import scattering_features
    from fedpriv.models import input_shape
    from fedpriv.seeding import generator

    if multiplicity == 1:
        return None
    shift = random_shift(SHIFT)
    image_shape = (images.shape[1], images.shape[2], images.shape[3])
    shape = input_shape(model, image_shape)
    scattered = shape != image_shape  # the model takes scattering features (model_inputs), not pixels

    def transform(examples: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        inputs = shift(examples, gen)
        if scattered:  # uncached and quiet: a new batch of shifted images every step
            inputs = scattering_features(inputs, progress=False)
        return inputs if normalise is None else normalise(inputs)

    return lambda seed: Augmentation(multiplicity, transform, generator(seed, "augmentation", device=images.device),
                                     shape)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    use_cache_dir(parser, args.cache_dir)
    from fedpriv.data import DatasetNotFoundError, check_available
    from fedpriv.models import MODELS

    if args.model is not None and args.model not in MODELS:
        parser.error(f"argument --model: invalid choice: {args.model!r} (choose from {', '.join(MODELS)})")
    try:  # every input checked before any data is loaded
        plan = plan_from_args(args)
        check_available(args.dataset, args.data_dir, args.download)
    except (DatasetNotFoundError, ValueError) as err:  # no data set, or a plan out of range
        parser.error(str(err))
    return report_json(parser, args.out, lambda: run(args, plan))


if __name__ == "__main__":
    main()
