"""Plans made once per parameter: the optimizers step each parameter through a fusekit plan
(``fusekit.AdamWPlan``, ...) made on its first step and reused while its attributes and its
arrays' layouts stay the same, so a step binds new pointers instead of validating and planning
again."""

from __future__ import annotations

from typing import Any, Dict, Hashable, Sequence

import fusekit


class PlanCache:
    """One plan per (parameter, operator), remade when ``key`` changes (the attributes, and
    whatever of the layouts the caller knows changes: the number of rows of a sparse gradient).
    A layout change the key does not show is caught by the plan itself: its run refuses arrays of
    another layout and modifies nothing; the step is then planned again once, and a second
    refusal is the caller's error."""

    def __init__(self) -> None:
        self._plans: Dict[Any, Any] = {}

    def run(self, owner: int, plan_type: Any, tensors: Sequence[Any], attrs: Dict[str, Any],
            key: Hashable, step: int = 0, lr: float = 0.0) -> Any:
        slot = (owner, plan_type)
        entry = self._plans.get(slot)
        if entry is not None and entry[0] == key:
            try:
                return entry[1].run(tensors, step, lr)
            except fusekit.Error:
                pass  # another layout (a re-strided parameter, a new state tensor): plan again
        plan = plan_type(tensors, attrs)
        self._plans[slot] = (key, plan)
        return plan.run(tensors, step, lr)

    def clear(self) -> None:
        self._plans.clear()
