"""The base every fusekit.torch optimizer shares: hyperparameter rules, parameter and gradient
checks, the stats of the last step, copy and pickle, and the skeleton of ``load_state_dict``.

One language for all six optimizers (docs/torch_contract.md):

- every message starts with ``fusekit.torch.<Class>:`` (``LazyAdam`` is ``SparseAdam``);
- one rule per hyperparameter, checked at construction, in ``add_param_group`` and again at each
  ``step`` (a scheduler or a user may have changed the group): ``lr`` a number or a one-element
  tensor, finite, >= 0; each beta in [0, 1), also after rounding to float32 (where the operators
  compute); ``eps`` finite and >= 2^-114 in float32 (the operators' floor: ``eps * sqrt(1 -
  beta2^t)`` is never 0); ``weight_decay`` finite and >= 0. The messages contain torch's own
  ("Invalid learning rate: ...") so code that matches them keeps working;
- one exception type per kind of refusal: ``ValueError`` for a hyperparameter, an unsupported
  option, a device, a layout, a shape or a state that does not fit; ``TypeError`` for a dtype and
  for parameters that are not tensors (torch's); ``RuntimeError`` where torch raises it (a sparse
  gradient given to a dense optimizer and a dense one to a sparse optimizer, with torch's
  messages); ``fusekit.Error`` (a ``ValueError``) for what the operator refuses, such as an index
  out of range;
- ``hugepages`` (a public attribute), ``last_stats`` (one entry per parameter stepped by the last
  ``step()``, in the order of the groups);
- the 8-bit optimizers' ``state_format`` ("dynamic_map", "fp8" or, dense ones only, "fp8_ue3m5")
  and ``guard_lost_v`` (a bool, True with the fp8 formats): hyperparameters of every group with
  the same rule (``check_state_options``, ``QuantStateOptimizer``).

``copy.deepcopy`` and pickle keep the constructor's options (``_OPTIONS``) besides torch's
``defaults``, ``state`` and ``param_groups``, and give an optimizer that steps exactly as the
original would: the plans and other caches are made again on the copy's first step.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from itertools import chain
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

import numpy as np
import torch

from fusekit import STATE_FORMATS  # the 8-bit state formats (docs/fp8_state.md)

from ._dtensor import is_dtensor, local
from ._plans import PlanCache

# The operators' lower bound on eps, in float32 (docs/apply_adam_w_quant.md, "eps").
EPS_MIN = float(np.float32(2.0 ** -114))
DENSE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: The types the constructors take for lr and betas (as torch's: numbers or one-element tensors).
LR = Union[float, torch.Tensor]
Betas = Tuple[Union[float, torch.Tensor], Union[float, torch.Tensor]]


class StepStats(NamedTuple):
    """What one parameter's step did in a dense optimizer (an entry of ``last_stats``)."""

    group: int  # index of the param group
    index: int  # type: ignore[assignment]  # position in group["params"] (shadows tuple.index)
    elements_skipped_nonfinite: int  # float32 state: elements the non-finite guard left unchanged
    blocks_skipped_nonfinite: int  # 8-bit state: blocks of 256 left unchanged


def f32(x: float) -> float:
    """``x`` rounded to float32, as the operators see it."""
    return float(np.float32(float(x)))


def scalar(x: Any) -> float:
    """A hyperparameter as a Python float (a one-element tensor is read now: an lr tensor changed
    in place takes effect at the next step)."""
    if isinstance(x, torch.Tensor):
        return float(x.item())
    return float(x)


def run_closure(closure: Optional[Callable[[], Any]]) -> Any:
    """torch's closure convention: called with grad enabled, its loss returned by step()."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class Hyper(NamedTuple):
    """A group's hyperparameters as Python floats, checked."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float


def _number(what: str, x: Any, kind: str = "a number") -> float:
    """``x`` as a float, or the ValueError naming ``what`` (``"{prefix}: Invalid ...: {x!r}{at}"``
    without its tail) when it is not a number."""
    try:
        return scalar(x)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{what}; it must be {kind}") from None


def check_hparams(prefix: str, group: Dict[str, Any], where: str = "") -> Hyper:
    """The one rule per hyperparameter (module docstring). ``where`` names the group in a step's
    messages. A group without ``weight_decay`` (the sparse optimizers') reads it as 0."""
    at = f" ({where})" if where else ""
    lr = group["lr"]
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError(f"{prefix}: Tensor lr must be 1-element{at}, got shape {tuple(lr.shape)}")
    lr_f = _number(f"{prefix}: Invalid learning rate: {lr!r}{at}", lr,
                   "a number or a one-element tensor")
    if not (math.isfinite(lr_f) and lr_f >= 0.0):
        raise ValueError(f"{prefix}: Invalid learning rate: {lr}{at}; it must be finite and >= 0")
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{prefix}: betas{at} must be a pair (beta1, beta2), got {betas!r}")
    if isinstance(betas[0], torch.Tensor) != isinstance(betas[1], torch.Tensor):
        raise ValueError(f"{prefix}: betas must be either both floats or both Tensors{at}")
    b = []
    for i, beta in enumerate(betas):
        bf = _number(f"{prefix}: Invalid beta parameter at index {i}: {beta!r}{at}", beta)
        if not (0.0 <= bf < 1.0 and 0.0 <= f32(bf) < 1.0):
            raise ValueError(f"{prefix}: Invalid beta parameter at index {i}: {beta}{at}; it must "
                             "be in [0, 1), also after rounding to float32 (where fusekit "
                             "computes: 1.0 would freeze the moment)")
        b.append(bf)
    eps = group["eps"]
    eps_f = _number(f"{prefix}: Invalid epsilon value: {eps!r}{at}", eps)
    if not (math.isfinite(eps_f) and f32(eps_f) >= EPS_MIN):
        raise ValueError(f"{prefix}: Invalid epsilon value: {eps}{at}; it must be finite and >= "
                         "4.81482486e-35 (2^-114) in float32, so that eps * sqrt(1 - beta2^t) is "
                         "never 0")
    wd = group.get("weight_decay", 0.0)
    wd_f = _number(f"{prefix}: Invalid weight_decay value: {wd!r}{at}", wd)
    if not (math.isfinite(wd_f) and wd_f >= 0.0):
        raise ValueError(f"{prefix}: Invalid weight_decay value: {wd}{at}; it must be finite and "
                         ">= 0")
    return Hyper(lr_f, b[0], b[1], eps_f, wd_f)


def param_label(group: Dict[str, Any], gi: int, pi: int, p: torch.Tensor) -> str:
    """How messages name a parameter: its name (named parameters), group, index and shape."""
    names = group.get("param_names")
    label = f"'{names[pi]}' " if names is not None and pi < len(names) else ""
    return f"parameter {label}(group {gi}, index {pi}, shape {list(p.shape)})"


def step_value(prefix: str, fail: Callable[[str], Any], step: Any) -> int:
    """A saved ``step`` (an int, a float or a one-element tensor, as torch, bitsandbytes or
    fusekit saved it) as an int in [0, 2^62)."""
    if isinstance(step, torch.Tensor):
        if step.numel() != 1:
            fail(f"step has {step.numel()} elements")
        step = step.item()
    try:
        ok = float(step) == int(step) and 0 <= int(step) < 2 ** 62
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        fail(f"step = {step!r} must be an integer in [0, 2^62)")
    return int(step)


class FusekitOptimizer(torch.optim.Optimizer):
    """What every fusekit.torch optimizer shares (module docstring). A subclass provides
    ``_check_param`` (a parameter of a group), ``_split_loaded_state`` and ``_own_state`` (its part
    of ``load_state_dict``), and may extend ``_OPTIONS`` and ``_reset_runtime``."""

    #: Constructor options kept by copy.deepcopy and pickle (torch keeps only defaults, state and
    #: param_groups).
    _OPTIONS: Tuple[str, ...] = ("hugepages",)

    hugepages: bool
    last_stats: List[Any]

    @classmethod
    def _prefix(cls) -> str:
        return f"fusekit.torch.{cls.__name__}"

    def __init__(self, params: Any, defaults: Dict[str, Any], *, hugepages: bool) -> None:
        self.hugepages = bool(hugepages)
        self.last_stats = []
        self._reset_runtime()
        defaults = {**defaults, **self._extra_defaults()}
        self._check_group(-1, defaults)
        super().__init__(params, defaults)

    def _extra_defaults(self) -> Dict[str, Any]:
        """Hyperparameters a subclass adds to the constructor's ``defaults`` (and so to every
        group), set before torch's constructor adds the groups."""
        return {}

    def _reset_runtime(self) -> None:
        """The caches a copy makes again: plans, and the parameters advised for huge pages."""
        self._plans = PlanCache()
        self._advised: set = set()

    # ---- groups ---------------------------------------------------------------------------------
    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch's add_param_group, then fusekit's checks of the new group; a refused group is
        removed again, so the optimizer is left as it was."""
        super().add_param_group(param_group)
        gi = len(self.param_groups) - 1
        group = self.param_groups[gi]
        try:
            self._check_group(gi, group)
            for pi, p in enumerate(group["params"]):
                self._check_param(gi, pi, group, p)
        except Exception:
            self.param_groups.pop()
            raise

    def _check_group(self, gi: int, group: Dict[str, Any]) -> Hyper:
        """The group's hyperparameters, checked (``gi`` -1: the constructor's defaults)."""
        return check_hparams(self._prefix(), group, f"param group {gi}" if gi >= 0 else "")

    def _check_param(self, gi: int, pi: int, group: Dict[str, Any], p: torch.Tensor) -> None:
        raise NotImplementedError

    def _label(self, gi: int, pi: int, p: torch.Tensor) -> str:
        return param_label(self.param_groups[gi], gi, pi, p)

    # ---- copy and pickle ------------------------------------------------------------------------
    def __getstate__(self) -> Dict[str, Any]:
        state = super().__getstate__()
        state["_fusekit_options"] = {k: getattr(self, k) for k in self._OPTIONS}
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # Also called by torch's load_state_dict with {"state", "param_groups"} only.
        state = dict(state)
        options = state.pop("_fusekit_options", None)
        super().__setstate__(state)
        if options is not None:
            for k, v in options.items():
                setattr(self, k, v)
        if "_plans" not in self.__dict__:  # a copy or an unpickled optimizer
            self._reset_runtime()
            if "last_stats" not in self.__dict__:
                self.last_stats = []
        self._after_setstate()

    def _after_setstate(self) -> None:
        """What a subclass restores after copy, pickle or load (the shared maps)."""

    # ---- load_state_dict ------------------------------------------------------------------------
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """torch's load_state_dict (its hooks and group checks, in its order), with each
        parameter's fusekit state checked first and then copied onto memory of the optimizer's own
        (never cast to the parameter's dtype, never aliasing the given dict). Everything is checked
        before anything changes."""
        state_dict = state_dict.copy()
        pre_hooks = self._optimizer_load_state_dict_pre_hooks
        post_hooks = self._optimizer_load_state_dict_post_hooks
        for hook in list(pre_hooks.values()):
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        groups, saved_groups = self.param_groups, state_dict["param_groups"]
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        self._check_loaded_groups(saved_groups)
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))
        claimed: Dict[torch.Tensor, Dict[str, Any]] = {}
        rest: Dict[Any, Any] = {}
        for k, v in state_dict["state"].items():
            p = id_map.get(k)
            if p is None or not isinstance(v, dict) or not v:
                rest[k] = v
                continue
            where = (f"{self._prefix()}.load_state_dict: state of parameter {k} (shape "
                     f"{list(p.shape)}, {p.dtype})")

            def fail(msg: str, where: str = where) -> None:
                raise ValueError(f"{where}: {msg}; nothing was loaded")

            ours, others = self._split_loaded_state(p, dict(v), fail)
            claimed[p] = ours
            rest[k] = others
        owned = {p: self._own_state(p, s) for p, s in claimed.items()}  # nothing written above
        state_dict["state"] = rest
        # torch's own load for the rest (groups, names, anything else in the state), its hooks
        # already run above.
        old_groups = [{k: v for k, v in g.items() if k != "params"} for g in groups]
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        try:
            super().load_state_dict(state_dict)
        finally:
            self._optimizer_load_state_dict_pre_hooks = pre_hooks
            self._optimizer_load_state_dict_post_hooks = post_hooks
        self._after_load_groups(old_groups)
        for p, s in owned.items():
            self.state[p].update(s)
        for post_hook in list(post_hooks.values()):
            post_hook(self)

    def _check_loaded_groups(self, saved_groups: List[Dict[str, Any]]) -> None:
        """Refuses saved groups this optimizer cannot take (before anything is loaded)."""

    def _after_load_groups(self, old_groups: List[Dict[str, Any]]) -> None:
        """After torch's load replaced the groups with the saved ones: what a subclass keeps from
        the groups it had (``old_groups``: each group's options, without its params)."""

    def _split_loaded_state(self, p: torch.Tensor, v: Dict[str, Any],
                            fail: Callable[[str], Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Checks one parameter's saved state (``fail(msg)`` raises): returns what this optimizer
        takes (checked, to be copied by ``_own_state``) and what torch loads as it is."""
        raise NotImplementedError

    def _own_state(self, p: torch.Tensor, s: Dict[str, Any]) -> Dict[str, Any]:
        raise NotImplementedError


#: Each 8-bit state format's per-block scale keys (m's, v's) in a parameter's state: the dynamic
#: map's absmax, the fp8 formats' scales (v's key names UE3M5's codes, so that a state says its
#: format).
SCALE_KEYS = {"dynamic_map": ("absmax1", "absmax2"), "fp8": ("scale1", "scale2"),
              "fp8_ue3m5": ("scale1", "scale2_ue3m5")}

_FORMAT_WORDS = {"dynamic_map": "'dynamic_map' (codes into the dynamic maps, bitsandbytes' format)",
                 "fp8": "'fp8' (m as E4M3, sqrt(v) as UE4M4, one scale per block)",
                 "fp8_ue3m5": "'fp8_ue3m5' (as 'fp8' with sqrt(v) as UE3M5, for dense layers)"}


def check_state_options(prefix: str, group: Dict[str, Any], where: str = "",
                        formats: Tuple[str, ...] = STATE_FORMATS) -> Tuple[str, bool]:
    """The 8-bit optimizers' two state hyperparameters (their rule, as ``check_hparams``'s):
    ``state_format`` one of ``formats``, ``guard_lost_v`` a bool, True with the fp8 formats (they
    always have the lost-v guard)."""
    at = f" ({where})" if where else ""
    fmt = group.get("state_format", "dynamic_map")
    if not isinstance(fmt, str) or fmt not in formats:
        extra = ("; 'fp8_ue3m5' is for dense layers (AdamW8bit, Adam8bit): an embedding table's "
                 "moments span more decades than UE3M5 holds" if fmt == "fp8_ue3m5" else "")
        raise ValueError(f"{prefix}: Invalid state_format value: {fmt!r}{at}; it must be "
                         + " or ".join(_FORMAT_WORDS[f] for f in formats)
                         + f" (docs/fp8_state.md){extra}")
    guard = group.get("guard_lost_v", True)
    if not isinstance(guard, (bool, np.bool_)):
        raise ValueError(f"{prefix}: Invalid guard_lost_v value: {guard!r}{at}; it must be True "
                         "or False")
    if fmt != "dynamic_map" and not guard:
        raise ValueError(f"{prefix}: guard_lost_v=False{at} is not available with "
                         f"state_format={fmt!r}: the FP8 formats always have the lost-v guard "
                         "(docs/fp8_state.md); guard_lost_v=False (the step dividing by v as "
                         "it decodes, as bitsandbytes') is for the dynamic-map format")
    return fmt, bool(guard)


def state_format_of(state: Dict[str, Any]) -> Optional[str]:
    """The format of a parameter's 8-bit state, from its keys (SCALE_KEYS): "fp8_ue3m5"
    (``scale2_ue3m5``), "fp8" (``scale1`` / ``scale2``), "dynamic_map" (``absmax1`` /
    ``absmax2``, ``qmap1`` / ``qmap2``), None (float32 moments, or no state yet)."""
    if "scale2_ue3m5" in state:
        return "fp8_ue3m5"
    if "scale1" in state or "scale2" in state:
        return "fp8"
    if any(k in state for k in ("absmax1", "absmax2", "qmap1", "qmap2")):
        return "dynamic_map"
    return None


class QuantStateOptimizer(FusekitOptimizer):
    """What the 8-bit optimizers share: the state formats (``state_format`` and
    ``guard_lost_v``, hyperparameters of every group: ``check_state_options``), the dynamic maps
    (one tensor per bit pattern, shared by every dynamic-map state, again after copy, pickle or
    load) and the ``min_8bit_size`` rule.

    A parameter's 8-bit state has the format of its group when it is made (its first step) and
    keeps it: its keys say which (``state_format_of``). A step whose group names the other format
    than a parameter's state, and a state_dict of the other format, are refused (a state is not
    converted)."""

    _state_defaults: Dict[str, Any]
    #: The state formats the optimizer takes (the row-wise ones: SPARSE_STATE_FORMATS).
    _STATE_FORMATS: Tuple[str, ...] = STATE_FORMATS

    def _set_state_options(self, state_format: Any, guard_lost_v: Any) -> None:
        """The constructor's two state hyperparameters (checked with the others in the base's
        constructor), to be added to ``defaults``; call before the base's ``__init__``."""
        self._state_defaults = {"state_format": state_format, "guard_lost_v": guard_lost_v}

    def _extra_defaults(self) -> Dict[str, Any]:
        return dict(self._state_defaults)

    def _check_group(self, gi: int, group: Dict[str, Any]) -> Hyper:
        hyper = super()._check_group(gi, group)
        check_state_options(self._prefix(), group, f"param group {gi}" if gi >= 0 else "",
                            self._STATE_FORMATS)
        return hyper

    def _check_state_format(self, label: str, group: Dict[str, Any],
                            state: Dict[str, Any]) -> None:
        """A step's phase one: the parameter's 8-bit state must be of its group's format."""
        have = state_format_of(state)
        want = group.get("state_format", "dynamic_map")
        if have is not None and have != want:
            raise ValueError(f"{self._prefix()}: {label} holds {have} state but its group's "
                             f"state_format is now {want!r}: a parameter's 8-bit state keeps the "
                             "format it was made with (states are not converted); nothing was "
                             "modified")

    def _group_format_of(self, p: torch.Tensor) -> str:
        for group in self.param_groups:
            if any(q is p for q in group["params"]):
                return str(group.get("state_format", "dynamic_map"))
        return "dynamic_map"

    def _check_loaded_format(self, p: torch.Tensor, have: Optional[str],
                             fail: Callable[[str], Any]) -> None:
        """A saved 8-bit state of the format this optimizer's group of ``p`` has, or refused."""
        want = self._group_format_of(p)
        if have is not None and have != want:
            keys = ", ".join(SCALE_KEYS[have] + (("qmap1", "qmap2") if have == "dynamic_map"
                                                 else ()))
            fail(f"it holds {have} state ({keys}) but this optimizer's state_format for its "
                 f"group is {want!r}; construct the optimizer with state_format={have!r} to "
                 "load it (fusekit does not convert a state between the formats)")

    def _check_loaded_groups(self, saved_groups: List[Dict[str, Any]]) -> None:
        for gi, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if "state_format" in saved and saved["state_format"] != group.get("state_format"):
                raise ValueError(f"{self._prefix()}.load_state_dict: param group {gi} was saved "
                                 f"with state_format {saved['state_format']!r}, this optimizer's "
                                 f"is {group.get('state_format')!r}; construct the optimizer "
                                 f"with state_format={saved['state_format']!r} to load it "
                                 "(fusekit does not convert a state between the formats); "
                                 "nothing was loaded")

    def _after_load_groups(self, old_groups: List[Dict[str, Any]]) -> None:
        # A state_dict of bitsandbytes (or of fusekit before the formats) has groups without the
        # two: they keep this optimizer's.
        for group, old in zip(self.param_groups, old_groups):
            for key in ("state_format", "guard_lost_v"):
                if key not in group and key in old:
                    group[key] = old[key]

    def _check_min_8bit_size(self, min_8bit_size: Any) -> int:
        if isinstance(min_8bit_size, bool) or not isinstance(min_8bit_size, (int, np.integer)) \
                or min_8bit_size < 0:
            raise ValueError(f"{self._prefix()}: min_8bit_size must be an int >= 0, got "
                             f"{min_8bit_size!r}")
        return int(min_8bit_size)

    def _init_maps(self) -> None:
        import fusekit  # the package's array-level helpers (no cycle: fusekit imports no torch)

        qm = torch.from_numpy(fusekit.create_dynamic_map(True))
        qv = torch.from_numpy(fusekit.create_dynamic_map(False))
        self._qmap_m, self._qmap_v = qm, qv
        # Maps shared by every 8-bit parameter's state (bytes -> tensor), the optimizer's own first.
        self._maps = {tensor_key(qm): qm, tensor_key(qv): qv}
        # What the fp8 format hands the operators for the maps it does not use: no elements.
        self._no_map = torch.empty(0, dtype=torch.float32)

    def _shared_map(self, t: torch.Tensor) -> torch.Tensor:
        """The optimizer's tensor with ``t``'s bits (a map of another bit pattern, such as
        bitsandbytes' float32 map, is copied and kept, shared from then on)."""
        t = t.detach().cpu().reshape(-1).contiguous()
        kb = tensor_key(t)
        if kb not in self._maps:
            self._maps[kb] = t.clone()
        return self._maps[kb]

    def _after_setstate(self) -> None:
        if "_maps" not in self.__dict__:  # a copy or an unpickled optimizer
            self._init_maps()
            # One pickled before the state formats: its groups get the defaults (a load_state_dict
            # keeps the groups' own: _after_load_groups).
            self.defaults.setdefault("state_format", "dynamic_map")
            self.defaults.setdefault("guard_lost_v", True)
            for group in self.param_groups:
                group.setdefault("state_format", self.defaults["state_format"])
                group.setdefault("guard_lost_v", self.defaults["guard_lost_v"])
        for st in self.state.values():  # the maps the states hold, shared again by bit pattern
            for key in ("qmap1", "qmap2"):
                t = st.get(key) if isinstance(st, dict) else None
                if isinstance(t, torch.Tensor):
                    st[key] = self._maps.setdefault(tensor_key(t), t)


# ---- the dense optimizers' parameter and gradient checks -------------------------------------------


def check_dense_param(prefix: str, label: str, p: torch.Tensor) -> None:
    """A dense optimizer's parameter: a CPU, strided tensor of a float dtype fusekit steps."""
    if p.dtype not in DENSE_DTYPES:
        raise TypeError(f"{prefix}: {label} has dtype {p.dtype}; fusekit steps float32, float16 "
                        "and bfloat16 parameters")
    if p.device.type != "cpu":
        raise ValueError(f"{prefix}: {label} is on {p.device}; fusekit steps CPU tensors")
    if p.layout != torch.strided:
        raise ValueError(f"{prefix}: {label} has layout {p.layout}; only dense (strided) "
                         "parameters are supported")


def check_dense_grad(prefix: str, torch_name: str, label: str, p: torch.Tensor,
                     g: torch.Tensor) -> None:
    """A dense optimizer's gradient: strided (torch's RuntimeError and message otherwise),
    floating-point, on the CPU, the parameter's shape (and local shape, for a DTensor)."""
    if g.is_sparse or g.layout != torch.strided:
        raise RuntimeError(f"{prefix}: {torch_name} does not support sparse gradients, please "
                           f"consider SparseAdam instead ({label}: {g.layout}; "
                           "fusekit.torch.SparseAdam steps sparse gradients)")
    if not g.is_floating_point():
        raise TypeError(f"{prefix}: the gradient of {label} has dtype {g.dtype}; a "
                        "floating-point gradient is needed")
    if g.device.type != "cpu":
        raise ValueError(f"{prefix}: the gradient of {label} is on {g.device}")
    if g.shape != p.shape:
        raise ValueError(f"{prefix}: the gradient of {label} has shape {list(g.shape)}, the "
                         f"parameter {list(p.shape)}")
    if is_dtensor(g) != is_dtensor(p) or (is_dtensor(p) and local(g).shape != local(p).shape):
        raise ValueError(f"{prefix}: the gradient of {label} is "
                         f"{'a DTensor' if is_dtensor(g) else 'a plain tensor'} of local shape "
                         f"{list(local(g).shape)}, the parameter "
                         f"{'a DTensor' if is_dtensor(p) else 'a plain tensor'} of local shape "
                         f"{list(local(p).shape)}")


class DenseWork(NamedTuple):
    group: int
    index: int  # type: ignore[assignment]  # position in group["params"]
    param: torch.Tensor
    hyper: Hyper
    options: Dict[str, Any]  # the group itself, for per-group flags (maximize, ...)


def dense_work(opt: FusekitOptimizer, torch_name: str) -> List[DenseWork]:
    """Every parameter with a gradient, with its group's checked hyperparameters: everything is
    checked before any parameter is stepped."""
    prefix = opt._prefix()
    work = []
    for gi, group in enumerate(opt.param_groups):
        hyper = None
        for pi, p in enumerate(group["params"]):
            g = p.grad
            if g is None:
                continue
            if hyper is None:
                hyper = opt._check_group(gi, group)
            check_dense_grad(prefix, torch_name, param_label(group, gi, pi, p), p, g)
            work.append(DenseWork(gi, pi, p, hyper, group))
    return work


def checked_moment(fail: Callable[[str], Any], p: torch.Tensor, key: str, t: Any,
                   float32_only: bool = False) -> torch.Tensor:
    """A saved float moment of a dense parameter: a floating-point tensor of the parameter's shape,
    sharded as the parameter is."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or (
            float32_only and t.dtype != torch.float32):
        what = "a float32 tensor" if float32_only else "a floating-point tensor"
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        fail(f"'{key}' must be {what}, got {got}")
    if t.shape != p.shape:
        fail(f"'{key}' has shape {list(t.shape)}")
    if is_dtensor(p) != is_dtensor(t) or (
            is_dtensor(p) and (t.placements != p.placements or local(t).shape != local(p).shape)):
        fail(f"'{key}' is not sharded as the parameter is (load a distributed state through "
             "torch.distributed.checkpoint, at the world size and sharding it was saved with)")
    return t


def tensor_key(t: torch.Tensor) -> bytes:
    """A map's bit pattern: states whose maps have the same bits share one tensor."""
    return t.detach().cpu().contiguous().view(torch.int32).numpy().tobytes()
