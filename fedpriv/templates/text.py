"""A fedpriv task on text: a small token classifier (Embedding, mean over tokens,
LayerNorm, Linear) that tells which of four topics a sentence is about.

No text corpus ships offline here, so ``prepare`` writes one: sentences drawn (seeded)
from four topic vocabularies mixed with common filler words, one ``topic<TAB>sentence``
line each. The vocabulary (``VOCABULARY``) is fixed in this file, never built from a
node's records (that would be a release of its own). Embedding has no book-keeping rule,
so fedpriv computes this model's per-example gradients with vmap.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedpriv.task import keyed_share

RUN_CONFIG = {"lr": 4.0, "max-grad-norm": 1.0, "lot-size": 128, "local-epochs": 3, "rounds": 3}
FLOOR = 0.70
"""Test accuracy the template's tests require (chance is 0.25)."""
TOPICS = {
    "sport": "goal match team score coach league player season win referee",
    "weather": "rain sun cloud storm wind snow forecast cold warm humid",
    "food": "bread soup cheese salad recipe oven spice dinner taste fruit",
    "music": "song guitar drum melody concert band chorus piano rhythm album",
}
FILLER = "the a of and to in is was it this that with on for very".split()
VOCABULARY = ("<pad>", "<unk>", *FILLER, *(word for words in TOPICS.values() for word in words.split()))
LENGTH = 12
FILES = {"train": "topics_train.tsv", "test": "topics_test.tsv"}


def model() -> nn.Module:
    """Embedding (32) → mean over the tokens → LayerNorm → Linear to the topics."""
    return TokenClassifier(len(VOCABULARY), 32, len(TOPICS))


class TokenClassifier(nn.Module):
    def __init__(self, vocabulary: int, width: int, classes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width, padding_idx=0)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = (tokens != 0).unsqueeze(-1).float()
        mean = (self.embedding(tokens) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(self.norm(mean))


def load_data(partition_id: int, num_partitions: int, data_dir: Path
              ) -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset]:
    """This node's share of the training sentences, and the test sentences, as token ids."""
    train = keyed_share(_read(data_dir / FILES["train"]), partition_id, num_partitions)
    return train, _read(data_dir / FILES["test"])


def _read(path: Path) -> torch.utils.data.TensorDataset:
    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} in the data folder (python -m fedpriv new writes it)")
    ids = {word: i for i, word in enumerate(VOCABULARY)}
    topics = list(TOPICS)
    tokens, labels = [], []
    for line in path.read_text().splitlines():
        topic, sentence = line.split("\t")
        words = [ids.get(word, 1) for word in sentence.split()][:LENGTH]
        tokens.append(words + [0] * (LENGTH - len(words)))
        labels.append(topics.index(topic))
    return torch.utils.data.TensorDataset(torch.tensor(tokens), torch.tensor(labels))


def prepare(data_dir: Path, records: int = 1200) -> None:
    """Write ``records`` seeded sentences (5 topic words among filler, the odd stray word of
    another topic), 80/20 into two TSV files."""
    import random

    rng = random.Random(0)
    topics = {topic: words.split() for topic, words in TOPICS.items()}
    lines = []
    for _ in range(records):
        topic = rng.choice(list(topics))
        other = rng.choice([t for t in topics if t != topic])
        words = rng.choices(topics[topic], k=4) + rng.choices(topics[other], k=1) + rng.choices(FILLER, k=6)
        rng.shuffle(words)
        lines.append(f"{topic}\t{' '.join(words)}")
    data_dir.mkdir(parents=True, exist_ok=True)
    cut = records * 4 // 5
    (data_dir / FILES["train"]).write_text("\n".join(lines[:cut]) + "\n")
    (data_dir / FILES["test"]).write_text("\n".join(lines[cut:]) + "\n")
