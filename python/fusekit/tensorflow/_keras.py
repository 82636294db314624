"""fusekit.tensorflow.LazyAdam and LazyAdam8bit: Keras 3 optimizers (TensorFlow backend) on
fusekit's LazyAdam and LazyAdamQuant."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import keras
import tensorflow as tf

import fusekit

from . import resource_sparse_apply_lazy_adam, resource_sparse_apply_lazy_adam_quant


def lazy_adam_step_size(learning_rate: Any, iterations: Any, beta_1: Any, beta_2: Any) -> Any:
    """The bias-corrected step of Keras' Adam, ``lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`` with
    ``t = iterations + 1``, in float32 (computed as keras.optimizers.Adam computes it)."""
    lr = tf.cast(learning_rate, tf.float32)
    t = tf.cast(iterations + 1, tf.float32)
    beta_1_power = tf.pow(tf.cast(beta_1, tf.float32), t)
    beta_2_power = tf.pow(tf.cast(beta_2, tf.float32), t)
    return lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)


def sparse_rows(gradient: tf.IndexedSlices, variable: Any) -> Optional[Tuple[Any, Any]]:
    """(values [N, dim], indices [N]) of an IndexedSlices gradient of a 2-D float32 variable, or
    None where fusekit's op does not apply (another rank or dtype: the caller's dense path)."""
    if variable.shape.rank != 2 or variable.dtype != tf.float32:
        return None
    return tf.cast(gradient.values, tf.float32), gradient.indices


def adam_arguments(who: str, beta_1: Any, beta_2: Any, epsilon: Any,
                   kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """Adam's beta_1, beta_2, epsilon as floats (the op takes them as attributes) and the other
    arguments less ``amsgrad``, which a lazy update does not have; refusals name ``who``."""
    if kwargs.pop("amsgrad", False):
        raise ValueError(f"{who}: amsgrad is not supported")
    for key, value in (("beta_1", beta_1), ("beta_2", beta_2), ("epsilon", epsilon)):
        if not isinstance(value, (int, float)):
            raise TypeError(f"{who}: {key} must be a float, got {type(value).__name__}")
    return dict(beta_1=float(beta_1), beta_2=float(beta_2), epsilon=float(epsilon),
                amsgrad=False, **kwargs)


@keras.saving.register_keras_serializable(package="fusekit")
class LazyAdam(keras.optimizers.Adam):
    """Adam that updates only the rows an ``IndexedSlices`` gradient names (an embedding table's
    rows in the batch): their m, v and weights, with fusekit's LazyAdam op; every other row's m,
    v and weights stay bit for bit as they were. Duplicate indices are summed; the bias
    correction is Keras Adam's. On dense gradients (and on sparse ones of variables that are not
    2-D float32) it is ``keras.optimizers.Adam``, step for step.

    The arguments are ``keras.optimizers.Adam``'s (``learning_rate`` may be a schedule),
    except ``amsgrad`` and ``weight_decay``, which a lazy update does not have (decay would touch
    every row each step). ``beta_1``, ``beta_2`` and ``epsilon`` are floats.

    The table is updated in place under its lock and is not switched to copy-on-read mode: the
    forward pass of ``keras.layers.Embedding`` reads the whole table every step, which would copy
    it in that mode. Runs under ``tf.function`` (``model.fit``); not under XLA
    (``jit_compile=True``): XLA has no kernel for a custom op (Keras' ``"auto"`` turns XLA off on
    a CPU-only machine).
    """

    def __init__(self, learning_rate: Any = 0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, name: str = "lazy_adam", **kwargs: Any) -> None:
        if kwargs.get("weight_decay") is not None:
            raise ValueError("fusekit.tensorflow.LazyAdam: weight_decay is not supported (a lazy "
                             "update touches only the batch's rows; decay would touch them all)")
        super().__init__(learning_rate=learning_rate, name=name, **adam_arguments(
            "fusekit.tensorflow.LazyAdam", beta_1, beta_2, epsilon, kwargs))

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        rows = sparse_rows(gradient, variable) if isinstance(gradient, tf.IndexedSlices) else None
        if rows is None:
            return super().update_step(gradient, variable, learning_rate)
        index = self._get_variable_index(variable)
        resource_sparse_apply_lazy_adam(
            variable, self._momentums[index], self._velocities[index],
            lazy_adam_step_size(learning_rate, self.iterations, self.beta_1, self.beta_2),
            *rows, beta1=self.beta_1, beta2=self.beta_2, epsilon=self.epsilon,
            copy_on_read=False)

    def get_config(self) -> Dict[str, Any]:
        config = super().get_config()
        config.pop("amsgrad", None)
        return config


def _is_8bit_candidate(variable: Any, min_8bit_size: int) -> bool:
    return (variable.shape.rank == 2 and variable.dtype == tf.float32
            and variable.shape.num_elements() >= min_8bit_size)


@keras.saving.register_keras_serializable(package="fusekit")
class LazyAdam8bit(LazyAdam):
    """:class:`LazyAdam` with 8-bit moments for its tables: every 2-D float32 variable of at
    least ``min_8bit_size`` elements (default 4096, as bitsandbytes) keeps m and v as uint8 codes
    with one float32 scale per row and block of 256 columns (``2 dim + 8 ceil(dim / 256)`` bytes
    per row instead of ``8 dim``), stepped by fusekit's LazyAdamQuant (docs/lazy_adam_quant.md):
    on the rows of an ``IndexedSlices`` gradient, and on every row for a dense gradient. The state
    of a table is two variables, packed by row as the op takes them: the codes uint8
    [rows, 2, dim] and the scales float32 [rows, 2, blocks], m's then v's in each row. Smaller or
    other variables keep float32 moments and are stepped as :class:`LazyAdam` steps them.

    ``state_format`` (docs/fp8_state.md): ``"dynamic_map"`` (the default), codes into fusekit's
    dynamic maps with the blocks' absmax (bitsandbytes' format); ``"fp8"``, m as E4M3 and
    sqrt(v) as UE4M4 with the blocks' scales (coded by bit arithmetic, no maps). The same bytes
    either way. Both formats run with the lost-v guard: where the old v decodes to zero while the
    old m does not, v is taken as m * m, so that a row whose v was lost to quantization does not
    move by m / epsilon.

    The 8-bit step per row: dequantize m and v, ``m = m*b1 + g*(1-b1)``,
    ``v = |v*b2 + g*g*(1-b2)|``, ``var += (m * -lr_t) / (sqrt(v) + epsilon)`` in float32,
    requantize (per block of the row); ``lr_t`` is Keras Adam's bias-corrected step. A row whose
    new values would not be finite is left unchanged, codes and scales included. Arguments as
    :class:`LazyAdam`, plus ``min_8bit_size`` and ``state_format``; the state saves and loads
    with the model (``.keras``), codes as uint8 variables.
    """

    def __init__(self, learning_rate: Any = 0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, min_8bit_size: int = 4096,
                 state_format: str = "dynamic_map", name: str = "lazy_adam_8bit",
                 **kwargs: Any) -> None:
        if isinstance(min_8bit_size, bool) or not isinstance(min_8bit_size, int) \
                or min_8bit_size < 0:
            raise ValueError("fusekit.tensorflow.LazyAdam8bit: min_8bit_size must be an int >= 0, "
                             f"got {min_8bit_size!r}")
        if not isinstance(state_format, str) or state_format not in fusekit.SPARSE_STATE_FORMATS:
            raise ValueError("fusekit.tensorflow.LazyAdam8bit: state_format must be one of "
                             f"{fusekit.SPARSE_STATE_FORMATS}, got {state_format!r}")
        super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                         epsilon=epsilon, name=name, **kwargs)
        self.min_8bit_size = min_8bit_size
        self.state_format = state_format
        fp8 = state_format == "fp8"  # no maps: the op gets empty ones
        self._qmap_m = None if fp8 else fusekit.create_dynamic_map(True)
        self._qmap_v = None if fp8 else fusekit.create_dynamic_map(False)

    def build(self, var_list: List[Any]) -> None:
        if self.built:
            return
        # The base optimizer's build (not Adam's, which would give every variable float32 slots).
        super(keras.optimizers.Adam, self).build(var_list)
        self._momentums, self._velocities = [], []
        self._codes: List[Any] = []  # per variable: its codes variable, or None (float32 state)
        self._absmax: List[Any] = []  # the blocks' absmax (dynamic_map) or scales (fp8)
        scales = "scales" if self.state_format == "fp8" else "absmax"
        for variable in var_list:
            if not _is_8bit_candidate(variable, self.min_8bit_size):
                self._momentums.append(self.add_variable_from_reference(variable, "momentum"))
                self._velocities.append(self.add_variable_from_reference(variable, "velocity"))
                self._codes.append(None)
                self._absmax.append(None)
                continue
            rows, dim = (int(n) for n in variable.shape)
            prefix = variable.path.replace("/", "_")
            # Packed by row (m's, then v's), as the op takes them; zero codes with a zero scale
            # decode to zero moments in both formats: a fresh state.
            self._momentums.append(None)
            self._velocities.append(None)
            self._codes.append(self.add_variable((rows, 2, dim), dtype="uint8",
                                                 name=f"{prefix}_moment_codes"))
            blocks = (dim + fusekit.BLOCK_SIZE - 1) // fusekit.BLOCK_SIZE
            self._absmax.append(self.add_variable((rows, 2, blocks), dtype="float32",
                                                  name=f"{prefix}_moment_{scales}"))

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        index = self._get_variable_index(variable)
        if self._codes[index] is None:
            return super().update_step(gradient, variable, learning_rate)
        if isinstance(gradient, tf.IndexedSlices):
            values, indices = tf.cast(gradient.values, tf.float32), gradient.indices
        else:  # a dense gradient: the 8-bit step on every row
            values = tf.cast(gradient, tf.float32)
            indices = tf.range(tf.shape(variable, out_type=tf.int64)[0])
        resource_sparse_apply_lazy_adam_quant(
            variable, self._codes[index], self._absmax[index], self._qmap_m, self._qmap_v,
            lazy_adam_step_size(learning_rate, self.iterations, self.beta_1, self.beta_2),
            values, indices, beta1=self.beta_1, beta2=self.beta_2, epsilon=self.epsilon,
            state_format=self.state_format, guard_lost_v=True)

    def get_config(self) -> Dict[str, Any]:
        config = super().get_config()
        config["min_8bit_size"] = self.min_8bit_size
        config["state_format"] = self.state_format
        return config
