"""fusekit.tensorflow.legacy.LazyAdam: LazyAdam for tf_keras' legacy optimizers (OptimizerV2)."""

from __future__ import annotations

from typing import Any, Dict

import tensorflow as tf
import tf_keras

from . import resource_sparse_apply_lazy_adam
from ._keras import adam_arguments, sparse_rows


@tf_keras.utils.register_keras_serializable(package="fusekit")
class LazyAdam(tf_keras.optimizers.legacy.Adam):
    """``tf_keras.optimizers.legacy.Adam`` whose sparse updates (``_resource_apply_sparse``) are
    fusekit's LazyAdam: only the rows an ``IndexedSlices`` gradient names change, duplicates
    summed in the op (no separate deduplication). Dense gradients take Adam's own dense update.
    ``beta_1``, ``beta_2`` and ``epsilon`` are floats; ``amsgrad`` is not supported.
    """

    def __init__(self, learning_rate: Any = 0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, name: str = "LazyAdam", **kwargs: Any) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **adam_arguments(
            "fusekit.tensorflow.legacy.LazyAdam", beta_1, beta_2, epsilon, kwargs))
        self._fusekit_betas = (float(beta_1), float(beta_2))

    def _resource_apply_sparse_duplicate_indices(self, grad: Any, handle: Any, indices: Any,
                                                 **kwargs: Any) -> Any:
        if sparse_rows(tf.IndexedSlices(grad, indices), handle) is None:
            return super()._resource_apply_sparse_duplicate_indices(grad, handle, indices,
                                                                    **kwargs)
        return self._resource_apply_sparse(grad, handle, indices, **kwargs)

    def _resource_apply_sparse(self, grad: Any, var: Any, indices: Any,
                               apply_state: Any = None) -> Any:
        rows = sparse_rows(tf.IndexedSlices(grad, indices), var)
        if rows is None:  # not a 2-D float32 table: Adam's own update (indices deduplicated)
            return super()._resource_apply_sparse(grad, var, indices, apply_state)
        var_device, var_dtype = var.device, var.dtype.base_dtype
        coefficients = (apply_state or {}).get((var_device, var_dtype)) or \
            self._fallback_apply_state(var_device, var_dtype)
        beta_1, beta_2 = self._fusekit_betas
        return resource_sparse_apply_lazy_adam(
            var, self.get_slot(var, "m"), self.get_slot(var, "v"), coefficients["lr"], *rows,
            beta1=beta_1, beta2=beta_2, epsilon=self.epsilon, use_locking=self._use_locking,
            copy_on_read=False)

    def get_config(self) -> Dict[str, Any]:
        config = super().get_config()
        config.pop("amsgrad", None)
        return config
