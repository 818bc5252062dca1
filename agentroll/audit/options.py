"""What an audit is asked to do, and the tolerances that decide its verdict.

Two presets, because what "equal" means depends on the arithmetic on both sides: two float32 engines agree to
about 1e-5 in a logprob (docs/audit.md has the figures measured between vLLM and transformers), while bfloat16
engines differ by a few hundredths on average and by more than 1 on an occasional low-probability token. The
preset follows `--dtype` unless `--precision` names the other one (audit in float32 what vLLM served in
bfloat16: the looser side decides).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from ..errors import UsageError

RAW, PROCESSED = "raw_logprobs", "processed_logprobs"
AGAINST = ("policy", "teacher")  # what the model is compared with: the sampled logprobs, or a teacher's scores
MODES = ("auto", RAW, PROCESSED)
DTYPES = ("float32", "bfloat16", "float16", "auto")
BATCH_TOKENS = 4096  # padded tokens per forward pass: the API's and the CLI's default


@dataclass(frozen=True, slots=True)
class Tolerance:
    """A record fails when any of these is exceeded (or it has a structural fault).

    `threshold`: the |Δ logprob| above which a token counts as "over" (the share figures). `max_abs`: the largest
    |Δ| allowed on any one token. `mean_abs`: the largest mean |Δ| over a record's compared tokens. `share`: the
    largest share of a record's tokens over `threshold`. `cut_noise`: how far (in logits) the two engines'
    logits may be apart when deciding whether top-k / top-p / min-p could have cut differently (docs/audit.md).
    """

    threshold: float
    max_abs: float
    mean_abs: float
    share: float
    cut_noise: float


PRESETS = {
    "float32": Tolerance(threshold=1e-3, max_abs=1e-2, mean_abs=1e-3, share=0.0, cut_noise=1e-4),
    "bfloat16": Tolerance(threshold=0.1, max_abs=math.inf, mean_abs=0.05, share=0.1, cut_noise=0.02),
}


@dataclass(slots=True)
class AuditOptions:
    model: str
    tokenizer: str | None = None  # default: the model's own
    dtype: str = "float32"
    device: str = "auto"
    precision: str | None = None  # a PRESETS key; default: from dtype
    logprobs_mode: str = "auto"  # auto: the manifest's servers[-1].logprobs_mode
    sample: int | None = None  # conversations to audit, stratified by stage; None: all
    seed: int = 0
    stages: frozenset[str] | None = None
    policy: str | None = None  # a head-to-head folder: this policy's records (its model's), else the first's
    include_frozen: bool = False
    batch_tokens: int = BATCH_TOKENS  # padded tokens per forward pass
    worst: int = 10
    templates: bool = True  # re-render first-turn prompts with the model's chat template
    accept_chat_template: bool = False  # a run template other than the model's (by hash): a warning, not a fault
    accept_unrendered: bool = False  # first-turn prompts the template check cannot re-render: a warning
    overrides: dict[str, float] = field(default_factory=dict)  # Tolerance fields set by flags
    against: str = "policy"  # teacher: the records' teacher_logprobs, the model being the teacher (docs/audit.md)

    def __post_init__(self) -> None:
        if self.against not in AGAINST:
            raise UsageError(f"--against {self.against!r}: use one of {', '.join(AGAINST)}")
        if self.against == "teacher" and self.logprobs_mode == PROCESSED:
            raise UsageError(
                "--against teacher: a teacher's scores are raw logprobs (prompt_logprobs), never processed"
            )
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.logprobs_mode not in MODES:
            raise UsageError(f"--logprobs-mode {self.logprobs_mode!r}: use one of {', '.join(MODES)}")
        if self.precision is not None and self.precision not in PRESETS:
            raise UsageError(f"--precision {self.precision!r}: use one of {', '.join(PRESETS)}")
        if self.sample is not None and self.sample < 1:
            raise UsageError(f"--sample {self.sample}: audit at least one conversation")
        if self.batch_tokens < 1:
            raise UsageError(f"--batch-tokens {self.batch_tokens}: must be at least 1")
        if self.worst < 0:
            raise UsageError(f"--worst {self.worst}: must be 0 or more")
        for name, value in self.overrides.items():
            if name not in {f.name for f in fields(Tolerance)}:
                raise UsageError(f"unknown tolerance {name!r}")
            if not value >= 0:  # also refuses NaN
                raise UsageError(f"--{name.replace('_', '-')} {value}: must be 0 or more")

    def preset(self, dtype: str) -> str:
        """`--precision`, else the preset of the dtype the model was loaded in."""
        if self.precision is not None:
            return self.precision
        return "float32" if dtype in ("float32", "float64") else "bfloat16"

    def tolerance(self, dtype: str) -> Tolerance:
        return replace(PRESETS[self.preset(dtype)], **self.overrides)
