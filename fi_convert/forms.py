"""The tensor forms of routed experts: the shape each stored tensor must have, from the sizes in
config.json, and where one expert's [out, in] matrix lies in it.

A role's matrix is what vLLM's FusedMoE holds per expert: w1 (gate) and w3 (up) [I, H], w2
(down) [H, I], w13 ([gate; up]) [2I, H]; a non-gated expert (Nemotron-H's relu2_no_mul) has no
gate: its up projection is w1, and its w13 is w1 alone ([I, H]). A form stores it per expert
("per_expert": one tensor per expert and projection), fused ("fused": one [E, 2I, H] w13 and
one [E, H, I] w2), stacked ("stacked": one [E, out, in] tensor per projection) or flat ("flat":
one 2-D [E*out, in] tensor per projection, the experts' matrices one after another: DBRX's
[E*I, H] w1, v1 and w2, its w2 stored transposed) or per expert fused ("per_expert_fused": one
[2I, H] w13, its rows [gate; up], and one [H, I] w2 per expert: ZAYA1's local_experts.E.
linear_fc1 and linear_fc2); a role the form lists as `transposed` is
stored [in, out] per expert (Llama-4's gate_up_proj [E, H, 2I]). A fused form may hold w13's
gate and up rows interleaved, [g0, u0, g1, u1, ...] (`Form.interleaved`: Inkling's
mlp.experts.w13_weight), of the same shape as [gate; up]: its family says which, and the rows
of gate are read as the even ones, those of up as the odd ones (`interleaved_span`). A tensor
is read under its form's one reading, never another: a shape that does not fit it is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import SourceError
from .families import PER_EXPERT_KINDS, Form
from .st_io import TensorInfo

# each role's [out, in] matrix in the sizes' letters
ROLE_DIMS = {"w1": ("I", "H"), "w3": ("I", "H"), "w2": ("H", "I"), "w13": ("2I", "H")}
# the stored tensors each form keeps, by role
STORED = {
    "per_expert": ("w1", "w3", "w2"),
    "per_expert_fused": ("w13", "w2"),
    "fused": ("w13", "w2"),
    "stacked": ("w1", "w3", "w2"),
    "flat": ("w1", "w3", "w2"),
}
# the forms whose w13 tensor holds the gate and the up projection, [gate; up]
FUSED_KINDS = ("fused", "per_expert_fused")


def per_expert(form: Form) -> bool:
    """Whether the form stores each expert's matrices in tensors of their own."""
    return form.kind in PER_EXPERT_KINDS


def gated(form: Form) -> bool:
    """Whether the form's experts have a gate (w3 or a fused w13 beside w1): a form that maps
    only w1 and w2 holds non-gated experts, w1 their up projection (families.ROLE_SETS)."""
    return bool({"w3", "w13"} & set(form.projections.values())) or not form.projections


def roles(form: Form) -> tuple[str, ...]:
    """The matrices of one expert, by role: w1, w3, w2 (gated) or w1, w2 (non-gated)."""
    return ("w1", "w3", "w2") if gated(form) else ("w1", "w2")


def stored_roles(form: Form) -> tuple[str, ...]:
    """The stored tensors the form keeps, by role (STORED, less w3 where non-gated)."""
    return tuple(r for r in STORED[form.kind] if gated(form) or r != "w3")


def stored_role(form: Form, role: str) -> str:
    """The role of the tensor that holds `role`'s matrix (a fused form's w13 holds w1 and w3)."""
    return "w13" if form.kind in FUSED_KINDS and role in ("w1", "w3") else role


def transposed(form: Form, role: str) -> bool:
    return stored_role(form, role) in form.transposed


def dims(form: Form, role: str, turned: bool | None = None) -> tuple[str, ...]:
    """The stored tensor's shape in letters: ("E", "H", "2I") for Llama-4's gate_up_proj,
    ("E*I", "H") for DBRX's w2; `turned`: as if the role were stored the other way (or not)."""
    d = ROLE_DIMS[stored_role(form, role)]
    d = d[::-1] if (transposed(form, role) if turned is None else turned) else d
    if form.kind == "flat":
        return (f"E*{d[0]}", d[1])
    return d if per_expert(form) else ("E", *d)


@dataclass(frozen=True)
class Sizes:
    """The layer's sizes and where they come from ("config.json", or a tensor's name where
    config.json gives none)."""

    num_experts: int
    hidden_size: int
    intermediate_size: int
    origin: str = "config.json"

    def value(self, letter: str) -> int:
        if "*" in letter:  # a flat form's rows: "E*I"
            return math.prod(self.value(p) for p in letter.split("*"))
        i = self.intermediate_size
        return {"E": self.num_experts, "H": self.hidden_size, "I": i, "2I": 2 * i}[letter]

    def said(self) -> str:
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        return f"E={e}, H={h}, I={i} from {self.origin}"


def expected(
    form: Form, role: str, sizes: Sizes, dtype: str, turned: bool | None = None
) -> tuple[int, ...]:
    """The stored tensor's shape (`turned`: as `dims`); packed FP4 (U8) holds two values a byte
    along K (in)."""
    t = transposed(form, role) if turned is None else turned
    shape = [sizes.value(d) for d in dims(form, role, t)]
    if dtype == "U8":
        k = -2 if t else -1
        shape[k] //= 2
    return tuple(shape)


def check_shape(info: TensorInfo, form: Form, role: str, sizes: Sizes, title: str) -> None:
    """One line naming the tensor, the shape its form reads and the shape found."""
    want = expected(form, role, sizes, info.dtype)
    if info.shape == want:
        return
    letters = dims(form, role)
    found, shown = list(info.shape), f"[{', '.join(letters)}]"
    msg = f"{info.name}: shape {found}, expected {list(want)} ({shown} with {sizes.said()})"
    # the shape of the other orientation of each expert's matrix (its last two dims swapped;
    # a flat form's [E*in, out] for [E*out, in])
    turned = not transposed(form, role)
    swapped = expected(form, role, sizes, info.dtype, turned)
    if info.shape == swapped and want != swapped:
        other = f"[{', '.join(dims(form, role, turned))}]"
        raise SourceError(
            f"{msg}; transposed? it is stored {other}, which is not how {title} checkpoints "
            "store it - check config.json's model_type and architectures, or export the "
            f"experts as {title} does"
        )
    raise SourceError(f"{msg}; the checkpoint and config.json disagree - download both again")


def tensor_sizes(form: Form, w1: TensorInfo, num_experts: int = 1) -> tuple[int, int]:
    """(H, I) as the w1 (or fused w13) tensor gives them under its form, for a config.json
    that gives none (a flat form's rows are `num_experts` experts')."""
    shape = matrix_shape(form, w1, num_experts)
    if len(shape) != 2:
        raise SourceError(
            f"{w1.name}: expected a 2-D matrix per expert, got shape {list(w1.shape)}"
        )
    out, k = shape[::-1] if transposed(form, "w1") else shape
    if w1.dtype == "U8":
        k *= 2
    return k, out // 2 if stored_role(form, "w1") == "w13" else out


def matrix_shape(form: Form, info: TensorInfo, num_experts: int) -> tuple[int, ...]:
    """One expert's part of the stored tensor `info`, as stored ([in, out] where transposed):
    a flat form's [E*R, C] is E parts [R, C]."""
    if per_expert(form):
        return tuple(info.shape)
    if form.kind == "flat":
        rows = info.shape[0] // num_experts if info.shape and num_experts else 0
        return (rows, *info.shape[1:])
    return tuple(info.shape[1:])


def expert_count(form: Form, w1: TensorInfo, said: int | None) -> int | None:
    """How many experts the w1 (or w13) tensor holds: a stacked or fused tensor's first
    dimension; a flat form's tensor does not say (config.json's count, `said`)."""
    if form.kind == "flat":
        return said
    return w1.shape[0] if w1.shape else 0


@dataclass(frozen=True)
class Span:
    """Where part of one expert's matrix lies: rows [start, start + count) of the 2-D `info`,
    its columns `cols` (all when None); `transposed`: those rows are the matrix's columns."""

    info: TensorInfo
    start: int
    count: int
    cols: tuple[int, int] | None
    transposed: bool = False
    # every `step`-th row from `start` (an interleaved w13's gate or up rows: 2)
    step: int = 1

    @property
    def extent(self) -> int:
        """How many stored rows the span lies in, from `start` (count where step is 1)."""
        return (self.count - 1) * self.step + 1 if self.count > 0 else 0


def span(
    form: Form,
    role: str,
    info: TensorInfo,
    expert: int,
    rows: tuple[int, int],
    cols: tuple[int, int] | None,
    num_experts: int = 0,
) -> Span:
    """Rows [a, b) and columns [c, d) (all when None) of expert `expert`'s `role` matrix, in
    the tensor `info` that holds it (a flat form's: one of `num_experts` experts')."""
    a, b = rows
    if form.kind == "per_expert":
        return Span(info, a, b - a, cols)
    if form.interleaved and stored_role(form, role) == "w13":
        return interleaved_span(form, role, info, expert, rows, cols)
    flat = info if form.kind in ("flat", "per_expert_fused") else flat_rows(info)
    per, width = matrix_shape(form, info, num_experts)[0], flat.shape[1]
    half = stored_role(form, role) == "w13" and role == "w3"
    first = 0 if per_expert(form) else expert * per  # a per-expert tensor is the expert's
    if not transposed(form, role):
        off = per // 2 if half else 0
        return Span(flat, first + off + a, b - a, cols)
    off = width // 2 if half else 0
    c, d = cols or (0, per)
    return Span(flat, first + c, d - c, (off + a, off + b), True)


def interleaved_span(
    form: Form,
    role: str,
    info: TensorInfo,
    expert: int,
    rows: tuple[int, int],
    cols: tuple[int, int] | None,
) -> Span:
    """Rows [a, b) of expert `expert`'s gate (w1) or up (w3) in a fused w13 of interleaved rows
    [g0, u0, g1, u1, ...] ([E, 2I, H]): rows 2a (+1 for up), 2a + 2, ... of the expert's 2I."""
    a, b = rows
    flat = flat_rows(info)
    per = matrix_shape(form, info, 0)[0]
    return Span(flat, expert * per + 2 * a + (role == "w3"), b - a, cols, step=2)


def flat_rows(info: TensorInfo) -> TensorInfo:
    """A stacked [E, R, ...] tensor seen as [E*R, rest]: expert e's row r is row e*R + r."""
    shape = (info.shape[0] * info.shape[1], math.prod(info.shape[2:]))
    return TensorInfo(info.name, info.dtype, shape, info.start, info.nbytes, info.file)


def stored_shape(form: Form, role: str, num_experts: int, matrix: tuple[int, ...]) -> tuple:
    """The stored tensor of `role` (a key of STORED) for per-expert matrices of shape `matrix`
    (a w13 tensor's is one half's: gate's)."""
    shape = tuple(matrix)
    if role == "w13":
        shape = (2 * shape[0], *shape[1:])
    if role in form.transposed:
        shape = shape[::-1]
    if form.kind == "flat":
        return (num_experts * shape[0], *shape[1:])
    return shape if per_expert(form) else (num_experts, *shape)
