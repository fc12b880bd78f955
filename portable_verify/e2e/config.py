"""What one end-to-end run measures: the configuration, its presets and the default prompts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from portable_verify.core.types import DEFAULT_TYPICAL, TypicalParams
from portable_verify.integrations.hf import DRAFT_MODES

PROMPTS: tuple[str, ...] = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in simple words why the sky is blue.",
    "List five tips for learning a new programming language.",
    "Describe how a bicycle works to a ten-year-old.",
    "What are the main causes of the seasons on Earth?",
    "Write a friendly email inviting a colleague to lunch next week.",
    "Summarise the water cycle in a few sentences.",
    "Give a recipe for a simple vegetable soup.",
)
CODE_EDIT_PROMPTS: tuple[str, ...] = (
    "Rename the variable `n` to `count` everywhere in this function and return the whole "
    "function:\n```python\ndef count_words(text):\n    n = 0\n    for line in text.splitlines():"
    "\n        for word in line.split():\n            if word.strip():\n                n += 1\n"
    "    return n\n```",
    "Add type hints to this function and return the whole function:\n```python\n"
    "def mean(values):\n    total = 0.0\n    for v in values:\n        total += v\n"
    "    return total / len(values) if values else 0.0\n```",
    "Add a docstring to this class and return the whole class:\n```python\nclass Stack:\n"
    "    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n"
    "\n    def __len__(self):\n        return len(self.items)\n```",
    "Replace the print calls with logging.info in this code and return the whole code:\n"
    "```python\nimport logging\n\ndef load(path):\n    print('loading', path)\n"
    "    with open(path) as f:\n        data = f.read()\n    print('read', len(data), 'bytes')\n"
    "    return data\n```",
)
"""Prompts whose answers copy most of the prompt: where prompt lookup (``--draft ngram``) pays."""
PROMPT_SETS: dict[str, tuple[str, ...]] = {"chat": PROMPTS, "code-edit": CODE_EDIT_PROMPTS}
RUNTIMES: tuple[str, ...] = ("torch", "openvino")
DRAFTS: tuple[str, ...] = ("int8", "int4", "ngram")
"""Draft names that are not folders: the target compressed (int8, int4) or prompt lookup."""


@dataclass(frozen=True)
class Preset:
    """A named set of options; the CLI refuses a flag that contradicts one of them."""

    name: str
    sets: dict[str, Any]
    why: str


PRESETS: dict[str, Preset] = {
    "seed": Preset("seed", {"method": "typical", "ks": (2,), "batch": 1, "dense": True},
                   "the founding measurement: typical acceptance, k=2, batch 1, verify against "
                   "the dense verifier"),
}
QUICK = {"ks": (2, 4), "max_new_tokens": 24, "num_prompts": 2, "rounds": 1}
"""What ``--quick`` changes, unless the flag for that option is given."""
SAMPLED_TEMPERATURE = 0.8
"""The default command's sampled half: token-wise rejection at this temperature, beside greedy."""
DEFAULT_TREES: tuple[str, ...] = ("2x3:4",)
"""Trees the default command runs beside its chains on the openvino runtime: the spine drafter's
3-deep path with one sibling per position, 4 nodes kept (5 scored positions, as the chain k=4
of ``--quick``, so it adds no chain); the best tree of the int4 trial and within 0.1x of the
int8 sweep's best (docs/e2e.md, "Trees, budgets and drafts on the OpenVINO runtime")."""
SWEEP_KS: tuple[int, ...] = tuple(range(1, 9))
"""Chain budgets ``--sweep`` tries when ``--k`` is not given."""


def default_runtime(dtype: str = "float32") -> tuple[str, str]:
    """The runtime a command without ``--runtime`` uses, and the reason, stated in its output.

    Static rule: OpenVINO where it is importable (its multi-token forward costs little more
    than a one-token forward, where torch's grows with every scored position), unless the run
    asks for what only torch runs (``--dtype bfloat16``); else torch.
    """
    import importlib.util

    if dtype != "float32":
        return "torch", f"--dtype {dtype} runs in torch only"
    if importlib.util.find_spec("openvino") is None:
        return "torch", "openvino not installed (pip install openvino for the faster runtime)"
    return "openvino", "installed; --runtime torch for transformers"


@dataclass
class E2EConfig:
    """Everything one ``e2e`` invocation measures."""

    target: str = "default"
    draft: str = "int8"
    runtime: str = "torch"
    dtype: str = "float32"
    ks: tuple[int, ...] = (1, 2, 3, 4, 5)
    method: str = "greedy"
    temperature: float = 1.0
    batch: int = 1
    max_new_tokens: int = 96
    num_prompts: int = 4
    rounds: int = 2
    seed: int = 0
    threads: int = 1
    prompt_set: str = "chat"
    dense: bool = False
    clock: str = "wall"  # "wall" or "cpu" (process CPU time: waiting for a core left out)
    preset: str | None = None
    typical: TypicalParams = DEFAULT_TYPICAL
    trees: tuple[str, ...] = ()  # tree shapes "WxD[:M]" (greedy, rejection or traversal;
    # batch > 1 on the openvino runtime)
    drafters: tuple[str, ...] = ()  # tree drafters (tree_drafters.DRAFTERS); () = the draft's
    # own: "ngram" for --draft ngram, else "spine"
    children: str = "without_replacement"  # trees at T > 0: siblings drawn so, or "iid"
    draft_modes: tuple[str, ...] = ("sampled",)  # chains at T > 0: sampled and/or argmax drafts
    sweep: bool = False  # choose each method's best budget on held-out prompts

    def __post_init__(self) -> None:
        if self.prompt_set not in PROMPT_SETS:
            raise ValueError(f"prompt_set must be one of {sorted(PROMPT_SETS)}, "
                             f"got {self.prompt_set!r}")
        for name in ("batch", "max_new_tokens", "num_prompts", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError(f"ks must be draft lengths >= 1, got {self.ks}")
        if len(set(self.ks)) != len(self.ks) or len(set(self.drafters)) != len(self.drafters):
            raise ValueError("each budget runs once: --k and --drafter list distinct values, "
                             f"got --k {self.ks}, --drafter {self.drafters}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0 keeps the default), got {self.threads}")
        if self.num_prompts > len(self.prompts):
            raise ValueError(f"num_prompts must be at most {len(self.prompts)} for the "
                             f"{self.prompt_set} prompts, got {self.num_prompts}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES}, got {self.runtime!r}")
        if self.runtime == "openvino" and self.dtype != "float32":
            raise ValueError("the openvino runtime runs float32 (its weights may be compressed "
                             f"with --draft int8/int4); got dtype {self.dtype!r}")
        if self.draft == "int4" and self.runtime != "openvino":
            raise ValueError("--draft int4 needs --runtime openvino")
        if self.clock not in ("wall", "cpu"):
            raise ValueError(f"clock must be 'wall' or 'cpu', got {self.clock!r}")
        if self.clock == "cpu" and self.threads != 1:
            raise ValueError("the cpu clock sums every thread's time: use it with threads=1")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.method in ("block", "traversal") and self.dense:  # narrower: paired rules
            raise ValueError(f"method {self.method!r} runs beside token-wise rejection; the "
                             f"dense verifier has no {self.method} rule (drop --dense)")
        if self.method == "traversal" and not self.trees:
            raise ValueError("--method traversal verifies trees only: give --tree (on a chain "
                             "traversal is block verification: --method block)")
        if self.drafters and not self.trees:
            raise ValueError("--drafter sets how trees are drafted: give --tree")
        if self.children not in ("without_replacement", "iid"):
            raise ValueError("children must be 'without_replacement' or 'iid', got "
                             f"{self.children!r}")
        if self.children != "without_replacement" and not self.trees:
            raise ValueError("--children sets how a tree's siblings are drawn: give --tree")
        if self.trees:
            self._check_trees()
        self._check_draft_modes()
        if self.sweep and self.num_prompts // self.batch < 2:
            raise ValueError("--sweep selects each method's best budget on some prompt batches "
                             "and reports it on others: it needs --prompts at least 2 x "
                             f"--batch, got {self.num_prompts} prompt(s) in batches of "
                             f"{self.batch}")

    def _check_draft_modes(self) -> None:
        modes = self.draft_modes
        if not modes or len(set(modes)) != len(modes) or any(m not in DRAFT_MODES
                                                              for m in modes):
            raise ValueError(f"--draft-mode must be one or both of {', '.join(DRAFT_MODES)}, "
                             f"comma separated, got {','.join(modes)!r}")
        exact = ("rejection", "block", "traversal")  # narrower: the exact sampled rules
        if modes != ("sampled",) and (self.method not in exact
                                      or self.temperature == 0 or self.dense):
            raise ValueError("--draft-mode compares how sampled rows draft: it needs --method "
                             "rejection, block or traversal at --temperature > 0 (no --dense); "
                             "got method "
                             f"{self.method}, temperature {self.temperature}")

    def _check_trees(self) -> None:
        from portable_verify.e2e.tree_loop import TreeShape

        shapes = [TreeShape.parse(text) for text in self.trees]
        if len(set(shapes)) != len(shapes):
            raise ValueError(f"each tree runs once: --tree lists one shape twice, got "
                             f"{','.join(self.trees)}")
        if self.method not in ("greedy", "rejection", "traversal"):  # narrower: TREE_METHODS
            raise ValueError("--tree runs with method greedy, rejection or traversal; got "
                             f"method {self.method}")
        if self.batch != 1 and self.runtime != "openvino":
            raise ValueError(f"--tree runs batch > 1 on the openvino runtime only (transformers "
                             f"modules take no per-row tree masks); got batch {self.batch} on "
                             f"{self.runtime}")
        from portable_verify.e2e.tree_drafters import DRAFTERS, get_drafter

        for name in self.drafters:
            try:
                get_drafter(name)
            except ValueError:
                raise ValueError(f"--drafter must be among {', '.join(sorted(DRAFTERS))} or "
                                 f"dynamic:F (F frontier nodes per depth), got {name!r}") from None
        if self.draft == "ngram" and self.batch != 1:
            raise ValueError("the ngram tree runs batch 1 (prompt lookup has no per-row tree "
                             f"forward); got --batch {self.batch}")
        if (self.draft == "ngram") != ("ngram" in self.tree_drafters) \
                or (self.draft == "ngram" and len(self.tree_drafters) > 1):
            raise ValueError("the ngram tree drafter and --draft ngram go together (prompt "
                             "lookup has no draft model to expand a tree with); got --draft "
                             f"{self.draft}, --drafter {','.join(self.tree_drafters)}")

    @property
    def tree_drafters(self) -> tuple[str, ...]:
        """The drafters trees run with: those given, else the draft's own."""
        if self.drafters:
            return self.drafters
        return ("ngram",) if self.draft == "ngram" else ("spine",)

    @property
    def greedy(self) -> bool:
        """Every row decodes greedily (checked token for token against target-only)."""
        return self.method == "greedy" or self.temperature == 0

    @property
    def prompts(self) -> tuple[str, ...]:
        return PROMPT_SETS[self.prompt_set]

    def as_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["ks"] = list(self.ks)
        data["trees"] = list(self.trees)
        data["drafters"] = list(self.tree_drafters)
        data["draft_modes"] = list(self.draft_modes)
        data["typical"] = asdict(self.typical)
        return data
