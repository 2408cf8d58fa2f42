"""Instructions for the 50 Meta-World tasks: a short sentence per task with paraphrases, split train / held-out.

As in MultiPath's ``envs/language.py``, a held-out paraphrase avoids the main verb and noun of the task's train
sentences where English allows, so success on it needs the text encoder's semantics rather than string matching.
"""

from __future__ import annotations

import numpy as np

from dmrl.envs.language import SPLITS

#: task (Meta-World name without -v3) -> (train sentences, held-out sentences); the first train one is the canonical.
INSTRUCTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "assembly": (("put the ring onto the peg", "assemble the nut on the peg"), ("slide the washer down the post",)),
    "basketball": (
        ("dunk the ball into the hoop", "put the ball in the basket"),
        ("score by dropping the sphere through the rim",),
    ),
    "bin-picking": (
        ("move the block from one bin to the other", "pick the cube out of the bin and place it in the other bin"),
        ("transfer the brick between the two containers",),
    ),
    "box-close": (("put the lid on the box", "close the box with its lid"), ("cover the crate with its top",)),
    "button-press-topdown": (("press the button from the top", "push the button down"), ("hit the switch from above",)),
    "button-press-topdown-wall": (
        ("press the button from the top behind the wall", "push the button down past the wall"),
        ("hit the switch from above beyond the barrier",),
    ),
    "button-press": (("press the button", "push the button in"), ("hit the switch on the front",)),
    "button-press-wall": (
        ("press the button behind the wall", "push the button past the wall"),
        ("hit the switch beyond the barrier",),
    ),
    "coffee-button": (
        ("press the button on the coffee machine", "push the coffee machine button"),
        ("start the espresso maker",),
    ),
    "coffee-pull": (
        ("pull the mug from the coffee machine", "take the cup out from under the coffee machine"),
        ("draw the beaker away from the espresso maker",),
    ),
    "coffee-push": (
        ("push the mug under the coffee machine", "slide the cup to the coffee machine"),
        ("shove the beaker beneath the espresso maker",),
    ),
    "dial-turn": (("turn the dial", "rotate the dial"), ("spin the knob around",)),
    "disassemble": (("pick the ring off the peg", "take the nut off the peg"), ("lift the washer up off the post",)),
    "door-close": (("close the door", "shut the door"), ("swing the hatch until it is closed",)),
    "door-lock": (("lock the door", "turn the door lock down"), ("secure the hatch by rotating its latch",)),
    "door-open": (("open the door", "pull the door open"), ("swing the hatch wide",)),
    "door-unlock": (("unlock the door", "turn the door lock up"), ("release the hatch latch",)),
    "hand-insert": (("put the hand into the hole", "move the gripper into the hole"), ("reach down into the opening",)),
    "drawer-close": (("close the drawer", "push the drawer shut"), ("slide the compartment in",)),
    "drawer-open": (("open the drawer", "pull the drawer out"), ("slide the compartment outwards",)),
    "faucet-open": (("open the faucet", "turn the faucet on"), ("rotate the tap handle to start the water",)),
    "faucet-close": (("close the faucet", "turn the faucet off"), ("rotate the tap handle to stop the water",)),
    "hammer": (
        ("hammer the nail into the wall", "hit the nail with the hammer"),
        ("drive the pin in using the mallet",),
    ),
    "handle-press-side": (
        ("press the handle down from the side", "push the side handle down"),
        ("lower the lever from its flank",),
    ),
    "handle-press": (("press the handle down", "push the handle down"), ("lower the lever",)),
    "handle-pull-side": (
        ("pull the handle up from the side", "lift the side handle"),
        ("raise the lever from its flank",),
    ),
    "handle-pull": (("pull the handle up", "lift the handle"), ("raise the lever",)),
    "lever-pull": (("pull the lever up", "lift the lever"), ("raise the arm of the switch",)),
    "pick-place-wall": (
        ("pick up the puck and place it behind the wall", "put the puck at the goal past the wall"),
        ("carry the disc over the barrier to the target",),
    ),
    "pick-out-of-hole": (
        ("pick the peg out of the hole", "lift the peg from the hole"),
        ("extract the pin from the opening",),
    ),
    "pick-place": (
        ("pick up the puck and place it at the goal", "put the puck on the target"),
        ("carry the disc to the marked spot",),
    ),
    "plate-slide": (
        ("slide the plate into the cabinet", "push the plate into the goal"),
        ("shove the dish into the cupboard",),
    ),
    "plate-slide-side": (
        ("slide the plate into the cabinet from the side", "push the plate sideways into the goal"),
        ("shove the dish sideways into the cupboard",),
    ),
    "plate-slide-back": (
        ("slide the plate out of the cabinet", "pull the plate back to the goal"),
        ("draw the dish out of the cupboard",),
    ),
    "plate-slide-back-side": (
        ("slide the plate out of the cabinet sideways", "pull the plate back sideways"),
        ("draw the dish sideways out of the cupboard",),
    ),
    "peg-insert-side": (
        ("insert the peg into the hole from the side", "put the peg into the side hole"),
        ("slot the pin sideways into the opening",),
    ),
    "peg-unplug-side": (
        ("unplug the peg from the side", "pull the peg out sideways"),
        ("withdraw the pin from the socket",),
    ),
    "soccer": (
        ("kick the ball into the goal", "push the ball into the net"),
        ("score by shoving the sphere between the posts",),
    ),
    "stick-push": (
        ("grab the stick and push the box with it", "use the stick to push the box"),
        ("shove the container using the rod",),
    ),
    "stick-pull": (
        ("grab the stick and pull the box with it", "use the stick to pull the box"),
        ("drag the container using the rod",),
    ),
    "push": (("push the puck to the goal", "slide the puck to the target"), ("shove the disc to the marked spot",)),
    "push-wall": (
        ("push the puck to the goal past the wall", "slide the puck around the wall"),
        ("shove the disc beyond the barrier",),
    ),
    "push-back": (
        ("push the puck back to the goal", "slide the puck backwards to the target"),
        ("shove the disc away toward the marked spot",),
    ),
    "reach": (("reach the goal", "move the gripper to the goal"), ("bring the hand to the target point",)),
    "reach-wall": (
        ("reach the goal behind the wall", "move the gripper to the goal past the wall"),
        ("bring the hand to the target point beyond the barrier",),
    ),
    "shelf-place": (
        ("pick up the block and place it on the shelf", "put the block on the shelf"),
        ("set the brick onto the rack",),
    ),
    "sweep-into": (
        ("sweep the puck into the hole", "push the puck into the hole"),
        ("brush the disc into the opening",),
    ),
    "sweep": (("sweep the puck off the table", "push the puck off the edge"), ("brush the disc over the side",)),
    "window-open": (("open the window", "slide the window open"), ("push the pane aside to uncover the frame",)),
    "window-close": (("close the window", "slide the window shut"), ("push the pane back across the frame",)),
}


def task_key(task: str) -> str:
    """Meta-World's name without its version suffix (button-press-v3 -> button-press)."""
    return task[: -len("-v3")] if task.endswith("-v3") else task


def paraphrases(task: str, split: str) -> tuple[str, ...]:
    """The sentences of ``task`` in ``split`` (train, heldout or all)."""
    if split not in SPLITS:
        raise ValueError(f"paraphrases: got {split!r}; allowed: {', '.join(SPLITS)}")
    train, heldout = INSTRUCTIONS[task_key(task)]
    return {"train": train, "heldout": heldout, "all": train + heldout}[split]


def sample_instruction(task: str, split: str, rng: np.random.Generator) -> str:
    """One sentence for ``task`` drawn uniformly from ``split``."""
    pool = paraphrases(task, split)
    return pool[int(rng.integers(len(pool)))]
