"""Instruction templates with paraphrases, split into train and held-out sets, and target parsing.

Held-out paraphrases use verbs and nouns that never occur in the train set, so a policy that generalises on
them has to rely on the language model's semantics, not on string matching.
"""

from __future__ import annotations

import re

import numpy as np

TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "grasp": {
        "train": (
            "pick up the {c} cup and put it on the pad",
            "grab the {c} mug, set it on the mat",
            "place the {c} cup onto the pad",
            "move the {c} mug to the pad",
            "put the {c} cup on the yellow pad",
            "take the {c} cup and drop it on the mat",
        ),
        "heldout": (
            "could you transfer the {c} tumbler over to the landing zone",
            "carry the {c} beaker to the target disc",
            "relocate the {c} vessel onto the platform",
        ),
    },
    "reach": {
        "train": (
            "reach the {c} cup",
            "move to the {c} mug",
            "touch the {c} cup",
            "go to the {c} mug",
            "put the gripper on the {c} cup",
        ),
        "heldout": (
            "approach the {c} tumbler",
            "bring the suction tool over to the {c} beaker",
            "head for the {c} vessel",
        ),
    },
}
SPLITS = ("train", "heldout", "all")


def sample_instruction(task: str, color: str, split: str, rng: np.random.Generator) -> str:
    """A paraphrase for ``task`` naming ``color``, drawn uniformly from ``split`` ("train"/"heldout"/"all")."""
    if split not in SPLITS:
        raise ValueError(f"paraphrases: got {split!r}; allowed: {', '.join(SPLITS)}")
    pool = TEMPLATES[task]
    templates = pool["train"] + pool["heldout"] if split == "all" else pool[split]
    return templates[int(rng.integers(len(templates)))].format(c=color)


def parse_target(instruction: str, colors: tuple[str, ...]) -> str:
    """The one colour in ``colors`` that ``instruction`` names; anything else is a one-line ValueError."""
    words = set(re.findall(r"[a-z]+", instruction.lower()))
    named = [c for c in colors if c in words]
    if len(named) != 1:
        what = "names no known object" if not named else f"names several objects ({', '.join(named)})"
        raise ValueError(
            f"instruction {instruction!r} {what}; name exactly one of the cups in the scene: {', '.join(colors)}"
        )
    return named[0]
